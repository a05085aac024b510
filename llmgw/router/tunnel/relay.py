"""The tunnels for routers outside the hub's process: the server's router workers, and standalone routers.

Agents dial one tunnel port, in the server process. Its router workers are processes of their own: the server runs
a relay beside the hub on 127.0.0.1 (``RelayServer``): a worker connects, sends one line ``SECRET NODE PORT``, and
is answered ``OK`` (then the connection is the tunnel stream's bytes, both ways) or ``ERR why``. The secret is the
one the server gave its workers (``workers.TOKEN_ENV``); any other is refused. A worker finds the relay in
``RELAY_ENV`` and reaches tunnelled engines through it (``RelayTunnels``, the client's ``Tunnels``): one loopback
hop more than the in-process router, and no other change. ``llmgw router --workers N``'s hub runs the same relay
for its workers, over ``remote.ControlTunnels`` instead of a ``TunnelHub`` (``remote.workers_relay``): its router
token stays in the hub's process.

A standalone router speaks the same line on the tunnel port itself, over TLS (``Door``: the hub hands it a
connection that presented no client certificate), with its router token for the secret: ``check`` (the control
plane's) says whether the token is a router's still, at each stream and every ``recheck_s`` for the streams open
(a deleted token's streams are cut within about a second). ``router.tunnel.remote`` is its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

from llmgw.router.client import Tunnels
from llmgw.router.response import ConnectFailed

log = logging.getLogger(__name__)

RELAY_ENV = "LLMGW_TUNNEL_RELAY"
_MAX_LINE = 512
#: A connection that has not sent its line by then is closed (the tunnel port is reachable by anyone).
LINE_TIMEOUT_S = 10.0
#: (credential) -> why it is refused ("": it is not).
Check = Callable[[str], Awaitable[str]]


class _Splice(asyncio.Protocol):
    """The tunnel stream's end at the relay: what the engine sends goes to the worker's connection."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.worker.transport is not None:
            self.worker.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.worker.transport is not None:
            self.worker.transport.close()


class _Worker(asyncio.Protocol):
    """A worker's connection to the relay: its line read, the stream opened, then bytes both ways."""

    def __init__(self, hub: Tunnels, check: Check, live: set[_Worker]) -> None:
        self.hub, self.check, self.live = hub, check, live
        self.credential = ""
        self.transport: asyncio.Transport | None = None
        self.stream: asyncio.Transport | None = None
        self.buf = bytearray()
        self.opening = False
        self.silent: asyncio.TimerHandle | None = None  # closes a connection that sends no line

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.silent = asyncio.get_running_loop().call_later(
            LINE_TIMEOUT_S, self._refuse, f"no request line within {LINE_TIMEOUT_S:g}s")

    def data_received(self, data: bytes) -> None:
        if self.stream is not None:
            self.stream.write(data)
            return
        self.buf += data
        if self.opening:
            return
        line, sep, _ = bytes(self.buf).partition(b"\n")
        if not sep:
            if len(self.buf) > _MAX_LINE:
                self._refuse("no request line")
            return
        del self.buf[:len(line) + 1]
        words = line.decode("latin-1").split(" ")
        if len(words) != 3 or not words[2].isdigit():
            self._refuse("expected one line: CREDENTIAL NODE PORT")
            return
        self.opening = True
        if self.silent is not None:
            self.silent.cancel()
        self.credential = words[0]
        task = asyncio.get_running_loop().create_task(self._open(words[1], int(words[2])))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _open(self, node: str, port: int) -> None:
        why = await self.check(self.credential)
        if why:
            self._refuse(why)
            return
        try:
            protocol = await self.hub.connect(node, port, lambda: _Splice(self))
        except ConnectFailed as exc:
            self._refuse(str(exc))
            return
        assert isinstance(protocol, _Splice) and protocol.transport is not None
        if self.transport is None or self.transport.is_closing():
            protocol.transport.close()
            return
        self.stream = protocol.transport
        self.live.add(self)
        self.transport.write(b"OK\n")
        if self.buf:
            self.stream.write(bytes(self.buf))
            self.buf.clear()

    def _refuse(self, why: str) -> None:
        if self.transport is not None:
            self.transport.write(b"ERR " + why.replace("\n", " ").encode()[:1024] + b"\n")
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.silent is not None:
            self.silent.cancel()
        self.live.discard(self)
        if self.stream is not None:
            self.stream.close()

    def pause_writing(self) -> None:  # the worker reads slower than the engine sends: hold the stream's credit
        if self.stream is not None:
            self.stream.pause_reading()

    def resume_writing(self) -> None:
        if self.stream is not None:
            self.stream.resume_reading()


def secret_check(secret: str) -> Check:
    """The relay's check: the workers' secret, compared in constant time."""
    async def check(credential: str) -> str:
        if hmac.compare_digest(credential.encode(), secret.encode()):
            return ""
        return "this is a tunnel relay, for its own router workers only (the secret their parent gave them)"
    return check


class Door:
    """Standalone routers' way in on the tunnel port: ``protocol()`` takes a connection the hub hands over (TLS, no
    client certificate); every ``recheck_s`` the credentials of the streams open are checked again, and the streams
    of one refused now are cut (a deleted router token)."""

    def __init__(self, hub: Tunnels, check: Check, *, recheck_s: float = 0.5) -> None:
        self._hub, self._check, self._recheck_s = hub, check, recheck_s
        self._live: set[_Worker] = set()
        self._task: asyncio.Task[None] | None = None

    def protocol(self) -> asyncio.Protocol:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._recheck())
        return _Worker(self._hub, self._check, self._live)

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(self._recheck_s)
            for credential in {w.credential for w in self._live}:
                why = await self._check(credential)
                if why:
                    for worker in [w for w in self._live if w.credential == credential]:
                        log.warning("cut a router's tunnel stream: %s", why)
                        if worker.transport is not None:
                            worker.transport.close()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class RelayServer:
    """The workers' relay on 127.0.0.1: their secret's streams opened through ``hub`` (a ``TunnelHub``, or a
    standalone router hub's ``remote.ControlTunnels``)."""

    def __init__(self, hub: Tunnels, secret: str) -> None:
        self._hub, self._check = hub, secret_check(secret)
        self._live: set[_Worker] = set()
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> str:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Worker(self._hub, self._check, self._live), "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None


class Refused(ConnectFailed):
    """The relay or door answered, refusing the stream (``ERR why``): it is up."""


class _Answer(asyncio.Protocol):
    """The worker's end until the relay answered its line."""

    def __init__(self, answered: asyncio.Future[bytes], what: str) -> None:
        self.answered, self.what = answered, what
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.answered.done():
            return
        line, sep, rest = bytes(self.buf).partition(b"\n")
        if not sep:
            return
        self.buf = bytearray(rest)
        if line == b"OK":
            self.answered.set_result(b"")
        else:
            why = line.removeprefix(b"ERR ").decode(errors="replace")
            self.answered.set_exception(Refused(f"{self.what} answered: {why}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(ConnectFailed(f"{self.what} closed the connection"))


async def open_line(host: str, port: int, line: str, factory: Callable[[], asyncio.Protocol], *,
                    what: str, ssl_context: ssl.SSLContext | None = None,
                    timeout_s: float = 10.0) -> asyncio.Protocol:
    """A connection to a relay or door at ``host:port`` that sent ``line`` and was answered OK: ``factory``'s
    protocol on it. ``ConnectFailed`` naming ``what`` and why when it cannot be made or was refused (nothing of
    the request was sent)."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[bytes] = loop.create_future()
    answer = _Answer(answered, what)
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.create_connection(
                lambda: answer, host, port, ssl=ssl_context, server_hostname=host if ssl_context else None)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport.write(line.encode() + b"\n")  # type: ignore[attr-defined]
            await answered
    except (OSError, TimeoutError) as exc:
        if transport is not None:
            transport.close()
        why = f"no answer within {timeout_s:g}s" if isinstance(exc, TimeoutError) else exc.strerror or exc
        raise ConnectFailed(f"cannot reach {what}: {why}") from None
    except BaseException:
        if transport is not None:
            transport.close()
        raise
    protocol = factory()
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if answer.buf:
        protocol.data_received(bytes(answer.buf))
    return protocol


class RelayTunnels:
    """A router worker's way to tunnelled engines: through its parent's relay (``llmgw server`` or a router's hub;
    ``client.Tunnels``)."""

    def __init__(self, address: str, *, secret: str) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port, self._secret = host, int(port), secret

    async def connect(self, node: str, port: int, factory: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        return await open_line(self._host, self._port, f"{self._secret} {node} {port}", factory,
                               what="the router workers' tunnel relay")
