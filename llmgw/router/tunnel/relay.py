"""The tunnels of ``llmgw server`` for its router workers (``--router-workers``): one hub, every process.

Agents dial one tunnel port, in the server process; its router workers are processes of their own. The server
runs a relay beside the hub on 127.0.0.1 (``RelayServer``): a worker connects, sends one line ``SECRET NODE
PORT``, and is answered ``OK`` (then the connection is the tunnel stream's bytes, both ways) or ``ERR why``. The
secret is the one the server gave its workers (``workers.TOKEN_ENV``); any other is refused. A worker finds the
relay in ``RELAY_ENV`` and reaches tunnelled engines through it (``RelayTunnels``, the client's ``Tunnels``): one
loopback hop more than the in-process router, and no other change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from collections.abc import Callable

from llmgw.router.response import ConnectFailed
from llmgw.router.tunnel.hub import TunnelHub

log = logging.getLogger(__name__)

RELAY_ENV = "LLMGW_TUNNEL_RELAY"
_MAX_LINE = 512


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

    def __init__(self, hub: TunnelHub, secret: str) -> None:
        self.hub, self.secret = hub, secret
        self.transport: asyncio.Transport | None = None
        self.stream: asyncio.Transport | None = None
        self.buf = bytearray()
        self.opening = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

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
        if len(words) != 3 or not hmac.compare_digest(words[0].encode(), self.secret.encode()) \
                or not words[2].isdigit():
            self._refuse("this is a server's tunnel relay, for its own router workers")
            return
        self.opening = True
        task = asyncio.get_running_loop().create_task(self._open(words[1], int(words[2])))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _open(self, node: str, port: int) -> None:
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
        if self.stream is not None:
            self.stream.close()

    def pause_writing(self) -> None:  # the worker reads slower than the engine sends: hold the stream's credit
        if self.stream is not None:
            self.stream.pause_reading()

    def resume_writing(self) -> None:
        if self.stream is not None:
            self.stream.resume_reading()


class RelayServer:
    def __init__(self, hub: TunnelHub, secret: str) -> None:
        self._hub, self._secret = hub, secret
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> str:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Worker(self._hub, self._secret), "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None


class _Answer(asyncio.Protocol):
    """The worker's end until the relay answered its line."""

    def __init__(self, answered: asyncio.Future[bytes]) -> None:
        self.answered = answered
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
            self.answered.set_exception(ConnectFailed(line.removeprefix(b"ERR ").decode(errors="replace")))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(ConnectFailed("the server's tunnel relay closed the connection"))


class RelayTunnels:
    """A router worker's way to tunnelled engines: through its server's relay (``client.Tunnels``)."""

    def __init__(self, address: str, *, secret: str) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port, self._secret = host, int(port), secret

    async def connect(self, node: str, port: int, factory: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes] = loop.create_future()
        answer = _Answer(answered)
        try:
            transport, _ = await loop.create_connection(lambda: answer, self._host, self._port)
        except OSError as exc:
            raise ConnectFailed(f"cannot reach the server's tunnel relay: {exc.strerror or exc}") from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(f"{self._secret} {node} {port}\n".encode())
        try:
            await answered
        except BaseException:
            transport.close()
            raise
        protocol = factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if answer.buf:
            protocol.data_received(bytes(answer.buf))
        return protocol
