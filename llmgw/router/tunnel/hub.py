"""The tunnel port (issue 33): agents behind NAT dial it, and the router reaches their engines through them.

A TLS listener that asks for a client certificate of the cluster CA: its common name is the node the tunnel
speaks for, and ``check`` (the control plane's: known to the store, not revoked) says whether it still may. Each
node has one tunnel at a time (a newer one replaces the older, as after a re-dial across a broken link); its
streams go only to that node's engines, by port, and the agent refuses any port that is not one of its engines'
(``agent.tunnel``): the tunnel is no proxy to anything else on the node or beyond it.

``on_change(node, up, why)`` is told each time a node's tunnel comes or goes, so the control plane lists its
replicas out of routing while it is down (and routers give up what waits there, ``router.hung``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable

from llmgw.api import tunnel
from llmgw.core import pki
from llmgw.router.response import ConnectFailed
from llmgw.router.tunnel.transport import StreamTransport

log = logging.getLogger(__name__)

#: (certificate PEM, node) -> why it is refused ("": it is not).
Check = Callable[[bytes, str], Awaitable[str]]
OnChange = Callable[[str, bool, str], None]


def server_context(*, ca_pem: bytes, cert_file: str, key_file: str) -> ssl.SSLContext:
    """The tunnel port's TLS: the server's certificate; a client certificate, when one is presented (an agent's),
    must be one the cluster CA issued. A connection without one is a standalone router's (``relay.Door``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca_pem.decode())
    context.load_cert_chain(cert_file, key_file)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


class _Tunnel(tunnel.Mux):
    """One agent's connection, at the hub: its node read from the certificate, checked, then served."""

    def __init__(self, hub: TunnelHub) -> None:
        super().__init__(opener=True, on_lost=hub._lost)
        self.hub = hub
        self.node = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        der = transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        if der is None:  # no client certificate: a standalone router's connection, or nobody's
            self.hub._no_certificate(transport)  # type: ignore[arg-type]
            return
        super().connection_made(transport)
        task = asyncio.get_running_loop().create_task(self.hub._admit(self, ssl.DER_cert_to_PEM_cert(der).encode()))
        self.hub._tasks.add(task)
        task.add_done_callback(self.hub._tasks.discard)


class TunnelHub:
    """The nodes' tunnels, by node id; ``connect`` opens a stream to one of a node's engines."""

    def __init__(self, *, context: ssl.SSLContext, check: Check | None = None, on_change: OnChange | None = None,
                 open_timeout_s: float = 5.0) -> None:
        self._context = context
        self._check = check
        self.on_change = on_change
        self._open_timeout_s = open_timeout_s
        self._tunnels: dict[str, _Tunnel] = {}
        #: Why each node that had a tunnel has none now.
        self.down: dict[str, str] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        #: Standalone routers' connections (no client certificate; ``relay.Door.protocol``); None: refused.
        self.routers: Callable[[], asyncio.Protocol] | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.get_running_loop().create_server(lambda: _Tunnel(self), host, port,
                                                                      ssl=self._context, ssl_handshake_timeout=10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for mux in list(self._tunnels.values()):
            mux.drop("the router is stopping")
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _no_certificate(self, transport: asyncio.Transport) -> None:
        if self.routers is None:
            transport.write(b"ERR this tunnel port takes node certificates (agents) and router tokens of a secure "
                            b"control plane only\n")
            transport.close()
            return
        protocol = self.routers()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def up(self) -> frozenset[str]:
        """The nodes whose tunnel is up now."""
        return frozenset(self._tunnels)

    async def _admit(self, mux: _Tunnel, cert_pem: bytes) -> None:
        try:
            node = pki.common_name(cert_pem)
        except pki.PkiError as exc:
            why = f"the certificate cannot be read: {exc}"
        else:
            why = await self._check(cert_pem, node) if self._check is not None else ""
        if why:
            log.warning("refused a tunnel from %s: %s", mux.peer, why)
            mux.send(tunnel.REFUSE, 0, why.encode()[:1024])
            if mux.transport is not None:
                mux.transport.close()
            return
        if mux.lost:
            return
        mux.node = node
        old = self._tunnels.get(node)
        self._tunnels[node] = mux
        self.down.pop(node, None)
        if old is not None:
            old.drop(f"node {node} dialled a new tunnel")
        log.info("node %s: tunnel up from %s", node, mux.peer)
        mux.send(tunnel.ACCEPT, 0)
        if self.on_change is not None:
            self.on_change(node, True, "")

    def _lost(self, mux: tunnel.Mux, why: str) -> None:
        node = getattr(mux, "node", "")
        if not node or self._tunnels.get(node) is not mux:
            return
        del self._tunnels[node]
        self.down[node] = why
        log.warning("node %s: tunnel down: %s", node, why)
        if self.on_change is not None:
            self.on_change(node, False, why)

    async def connect(self, node: str, port: int, factory: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        """A connection to the engine on ``port`` of ``node``, through its tunnel: ``factory``'s protocol on it.

        ``ConnectFailed`` when the node has no tunnel now or the agent refused the stream (nothing was sent).
        """
        mux = self._tunnels.get(node)
        if mux is None:
            why = self.down.get(node, "its agent has not dialled this router's tunnel port")
            raise ConnectFailed(f"cannot reach node {node}'s engine on port {port}: no tunnel from it ({why})")
        try:
            stream = await mux.open(port, self._open_timeout_s)
        except tunnel.TunnelError as exc:
            raise ConnectFailed(f"node {node}'s tunnel refused a stream to port {port}: {exc}") from None
        protocol = factory()
        protocol.connection_made(StreamTransport(stream, protocol, node))
        return protocol
