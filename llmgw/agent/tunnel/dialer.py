"""The tunnel the agent keeps open to its control plane's tunnel port, and the streams it carries to its engines.

The control plane offers the port after each Register of a node whose ``engine_access`` is tunnel or auto
(``TunnelOffer``); the agent dials the host it registered with, on that port, with its node certificate, and
verifies the server's certificate against the cluster CA and that host, as its gRPC stream does. A tunnel that
drops (the link went down: nothing heard for ``api.tunnel.DEAD_S``) is dialled again with a jittered, capped
backoff; the engines are never touched, so their replicas come back as they were.

A stream goes only to a port one of this node's engines listens on (``engine_ports``: from the supervisor's
shard statuses), on the address that engine listens on: anything else is refused with why, so the tunnel is no
way into the node's other services or its network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Mapping

from llmgw.agent import enginetls
from llmgw.agent.config import AgentConfig
from llmgw.api import tunnel
from llmgw.core.shards import ShardStatus

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0


def engine_ports(endpoints: Iterable[str]) -> dict[int, tuple[str, int, bool]]:
    """Each engine's port -> (host, port, TLS) it listens on, from its endpoint URL (``http[s]://HOST:PORT``)."""
    out = {}
    for url in endpoints:
        parts = urllib.parse.urlsplit(url)
        if parts.hostname and parts.port:
            out[parts.port] = (parts.hostname, parts.port, parts.scheme == "https")
    return out


class _Pipe(asyncio.Protocol):
    """An engine's connection for one tunnel stream: bytes both ways, each side's back-pressure passed on."""

    def __init__(self, stream: tunnel.Stream) -> None:
        self.stream = stream
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        stream = self.stream
        stream.on_data = self.transport.write
        stream.on_close = lambda why: self.transport.close() if self.transport is not None else None
        stream.on_blocked = lambda shut: (transport.pause_reading() if shut  # type: ignore[attr-defined]
                                          else transport.resume_reading())  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.stream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stream.close(f"the engine's connection broke: {exc}" if exc else "")

    def pause_writing(self) -> None:  # the engine reads slower than the router sends: hold its credit
        self.stream.pause()

    def resume_writing(self) -> None:
        self.stream.resume()


class TunnelDialer:
    """Keeps the node's tunnel up while the control plane offers one; ``offer`` (re)aims it."""

    def __init__(self, *, node_id: str, context: Callable[[], ssl.SSLContext],
                 engines: Callable[[], Mapping[int, tuple[str, int, bool]]],
                 engine_ssl: Callable[[], ssl.SSLContext | bool]) -> None:
        self.node_id = node_id
        self._context = context
        self._engines = engines
        self._engine_ssl = engine_ssl
        self._target: tuple[str, int] | None = None
        self._aimed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.mux: tunnel.Mux | None = None
        #: How many times a tunnel was accepted (tests and ``describe`` read it).
        self.dials = 0

    def offer(self, host: str, port: int) -> None:
        """The control plane's tunnel port: dialled now (and kept), or kept if it is the one already dialled."""
        if self._target == (host, port):
            return
        self._target = (host, port)
        log.info("tunnel: the control plane offers its tunnel port %s:%d; dialling it", host, port)
        if self.mux is not None:
            self.mux.drop("the control plane offered another tunnel port")
        self._aimed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine tunnel")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.mux is not None:
            self.mux.drop("the agent is stopping")

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while True:
            await self._aimed.wait()
            assert self._target is not None
            host, port = self._target
            why = await self._once(host, port)
            if self.mux is not None and self.mux.admitted == "":
                backoff = BACKOFF_MIN_S  # it ran: the next dial soon
            log.warning("tunnel to %s:%d: %s; dialling again in %.1fs", host, port, why, backoff)
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _once(self, host: str, port: int) -> str:
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[str] = loop.create_future()

        def on_lost(_: tunnel.Mux, why: str) -> None:
            if not lost.done():
                lost.set_result(why)

        try:
            async with asyncio.timeout(10):
                _, mux = await loop.create_connection(
                    lambda: tunnel.Mux(opener=False, on_open=self._open, on_lost=on_lost), host, port,
                    ssl=self._context(), server_hostname=host)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            return f"cannot connect: {exc}"
        self.mux = mux
        log.info("tunnel to %s:%d connected", host, port)
        self.dials += 1
        return await lost

    async def _open(self, stream: tunnel.Stream, port: int) -> str:
        target = self._engines().get(port)
        if target is None:
            return (f"port {port} is not an engine of node {self.node_id}: a tunnel reaches only this node's own "
                    "engines, by the port in the router's table")
        host, engine_port, tls = target
        try:
            async with asyncio.timeout(5):
                await asyncio.get_running_loop().create_connection(
                    lambda: _Pipe(stream), host, engine_port, ssl=self._engine_ssl() if tls else None,
                    server_hostname=None if not tls else self.node_id)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            return f"cannot connect to node {self.node_id}'s engine on port {port}: {exc}"
        return ""


def for_agent(cfg: AgentConfig, statuses: Callable[[], Iterable[ShardStatus]],
              engine_tls: enginetls.EngineTls) -> TunnelDialer | None:
    """The engine tunnel for engine_access tunnel or auto (it dials when the control plane offers); else None."""
    if cfg.engine_access == "direct" or cfg.tls is None:
        return None
    pki = cfg.tls

    def context() -> ssl.SSLContext:  # read at each dial: a renewed certificate is the next tunnel's
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(pki.cert), str(pki.key))
        return ctx

    return TunnelDialer(node_id=cfg.node_id, context=context,
                        engines=lambda: engine_ports(s.endpoint for s in statuses() if s.endpoint),
                        engine_ssl=lambda: enginetls.client_ssl(engine_tls))
