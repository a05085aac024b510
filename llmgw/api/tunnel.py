"""The engine tunnel's wire (issue 33): byte streams multiplexed over one mutual-TLS connection an agent dials.

A node behind NAT cannot be reached, but it can dial out. Its agent opens one TLS connection (its node
certificate) to a router's tunnel port and keeps it; the router then opens streams over it, each one a TCP
connection's worth of bytes to one of that node's engines. The router's HTTP/1.1 client (``router.client``) runs
over a stream exactly as over a socket, so streaming, cancellation (a closed stream closes the engine's
connection), timeouts, retries and ejection are the same code as for a direct engine.

The carrier is a framed multiplex of our own, not HTTP/2 or the agent's gRPC stream (README "Nodes behind NAT"
gives the measurements): it carries the client's bytes as they are, adds 9 bytes per frame, and keeps the
agent's control stream free of engine traffic.

A frame: ``type`` (1 byte), ``stream`` (4), ``length`` (4), then ``length`` bytes:

* ``OPEN`` (router → agent): open a stream to the engine on this node's port given (ASCII digits);
* ``ACCEPT`` / ``REFUSE`` (agent → router): the engine's connection is made, or why not (UTF-8);
* ``DATA``: bytes of the stream; ``CLOSE``: the stream is over (either side; optional reason);
* ``CREDIT``: the receiver consumed that many bytes (4 bytes, big-endian): the sender may send them again.
  Each side may have ``WINDOW`` bytes unconsumed per stream, so a slow client pauses its engine's reads at the
  agent, as a full socket would (back-pressure end to end);
* ``PING`` / ``PONG``: liveness. The router pings every ``PING_S``; either side that hears nothing for
  ``DEAD_S`` drops the connection (a link that went down silently), and the agent dials again.

Standard library only: the router and the agent both import it, and never each other.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

OPEN, ACCEPT, REFUSE, DATA, CLOSE, CREDIT, PING, PONG = range(1, 9)
_HEAD = struct.Struct(">BII")
WINDOW = 1 << 18  # bytes a side may have in flight per stream before the receiver's CREDIT
_CREDIT_EVERY = WINDOW // 4
MAX_FRAME = 1 << 20
PING_S = 1.0
DEAD_S = 4.0
#: Where a replica served through its node's tunnel is, in the routers' table: ``http://NODE.tunnel.invalid:PORT``.
#: ``.invalid`` never resolves (RFC 2606), so a router without tunnels (an older release) fails the connect and
#: ejects the replica, instead of sending its request and the engine's key to whatever listens at that port.
HOST_SUFFIX = ".tunnel.invalid"
#: On the control plane's endpoints answer: its tunnel port, where a standalone router opens its tunnel streams
#: (``router.tunnel.remote``) at the host it reads the table from.
PORT_HEADER = "X-Llmgw-Tunnel-Port"


class TunnelError(Exception):
    """The tunnel refused a stream or went down; the message says which and why."""


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(kind, stream, len(payload)) + payload


def url(node: str, port: int) -> str:
    """The table's URL of the engine on ``port`` of ``node``, reached through the node's tunnel."""
    return f"http://{node}{HOST_SUFFIX}:{port}"


def node_of(netloc: str) -> tuple[str, int] | None:
    """(node, port) of a tunnel URL's ``host:port`` (case kept: node ids are), None for any other address."""
    host, _, port = netloc.rpartition(":")
    if not host.endswith(HOST_SUFFIX) or not port.isdigit():
        return None
    return host[:-len(HOST_SUFFIX)], int(port)


class Stream:
    """One stream's state at either end: its send window, what it buffered while its consumer was paused."""

    def __init__(self, mux: Mux, sid: int) -> None:
        self.mux, self.sid = mux, sid
        self.window = WINDOW  # bytes we may send before the peer's next CREDIT
        self.pending = bytearray()  # written while the window was shut
        self.blocked = False  # the source was told to pause
        self.held: list[bytes] = []  # received while the consumer was paused
        self.paused = False  # the consumer asked for no more data for now
        self.unacked = 0  # consumed bytes not yet credited back
        self.closed = False
        #: Called with each chunk received, and once when the peer ends the stream: "" when it closed it
        #: cleanly (the engine's end of file), else why it broke.
        self.on_data: Callable[[bytes], None] = lambda data: None
        self.on_close: Callable[[str], None] = lambda why: None
        #: Called when the send window shuts (True) and opens again (False): the source pauses and resumes.
        self.on_blocked: Callable[[bool], None] = lambda blocked: None

    def write(self, data: bytes) -> None:
        if self.closed or not data:
            return
        if self.pending or self.window <= 0:
            self.pending += data
            self._block(True)
            return
        self._send(data)

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.window > 0:
            part = view[:min(self.window, MAX_FRAME)]
            self.window -= len(part)
            self.mux.send(DATA, self.sid, bytes(part))
            view = view[len(part):]
        if view:
            self.pending += view
            self._block(True)

    def credit(self, n: int) -> None:
        self.window += n
        if self.pending and self.window > 0:
            data, self.pending = bytes(self.pending), bytearray()
            self._send(data)
            if not self.pending:
                self._block(False)

    def _block(self, shut: bool) -> None:
        """Tells the source to pause (the window is shut and bytes wait) or resume, once per change."""
        if shut != self.blocked:
            self.blocked = shut
            self.on_blocked(shut)

    def received(self, data: bytes) -> None:
        if self.paused:
            self.held.append(data)
            return
        self.on_data(data)
        self.consumed(len(data))

    def consumed(self, n: int) -> None:
        self.unacked += n
        if self.unacked >= _CREDIT_EVERY:
            self.mux.send(CREDIT, self.sid, struct.pack(">I", self.unacked))
            self.unacked = 0

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        while self.held and not self.paused and not self.closed:
            self.received(self.held.pop(0))

    def close(self, why: str = "") -> None:
        """Ends the stream from this side: the peer is told, nothing more is delivered here."""
        if not self.closed:
            self.closed = True
            self.mux.send(CLOSE, self.sid, why.encode()[:512])
            self.mux.streams.pop(self.sid, None)

    def ended(self, why: str) -> None:
        """The peer closed it ("" cleanly), or the tunnel went down (``why``)."""
        if self.closed:
            return
        self.closed = True
        self.mux.streams.pop(self.sid, None)
        while self.held:  # what arrived before the close is still the consumer's
            self.on_data(self.held.pop(0))
        self.on_close(why)


class Mux(asyncio.Protocol):
    """One tunnel connection, at the router's end (``opener``: it opens streams and pings) or the agent's.

    ``on_open(stream, port)`` (the agent's end) connects the stream to the engine on ``port`` and returns
    "" or why it may not.
    """

    def __init__(self, *, opener: bool, on_open: Callable[[Stream, int], Awaitable[str]] | None = None,
                 on_lost: Callable[[Mux, str], None] | None = None) -> None:
        self.opener = opener
        self._on_open = on_open
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self._opening: dict[int, asyncio.Future[None]] = {}
        self._buf = bytearray()
        self._next = 1
        self._loop = asyncio.get_running_loop()
        self.heard = self._loop.time()
        self._ticker: asyncio.TimerHandle | None = None
        self.lost = False
        self.why_lost = ""
        self._write_paused = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.peer: Any = None
        #: At the agent's end: None until the hub answered our certificate, then "" (accepted) or why not.
        self.admitted: str | None = None

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.heard = self._loop.time()
        self._ticker = self._loop.call_later(PING_S, self._tick)

    def data_received(self, data: bytes) -> None:
        self.heard = self._loop.time()
        buf = self._buf
        buf += data
        offset = 0
        size = len(buf)
        while size - offset >= 9:
            kind, sid, length = _HEAD.unpack_from(buf, offset)
            if length > MAX_FRAME + 4096:
                self.drop(f"a frame of {length} bytes, over the limit: not a tunnel peer")
                return
            if size - offset - 9 < length:
                break
            payload = bytes(buf[offset + 9:offset + 9 + length])
            offset += 9 + length
            self._frame(kind, sid, payload)
            if self.lost:
                return
        del buf[:offset]

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(self.why_lost or (f"the tunnel connection broke: {exc}" if exc else "the tunnel connection closed"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False

    # -- frames --

    def _frame(self, kind: int, sid: int, payload: bytes) -> None:
        if kind == DATA:
            stream = self.streams.get(sid)
            if stream is not None:
                stream.received(payload)
        elif kind == CREDIT:
            stream = self.streams.get(sid)
            if stream is not None and len(payload) == 4:
                stream.credit(struct.unpack(">I", payload)[0])
        elif kind == CLOSE:
            stream = self.streams.get(sid)
            if stream is not None:
                stream.ended(payload.decode(errors="replace"))
        elif kind == PING:
            self.send(PONG, 0)
        elif kind == PONG:
            pass
        elif sid == 0 and kind in (ACCEPT, REFUSE) and not self.opener:  # the hub's answer to our certificate
            self.admitted = "" if kind == ACCEPT else (payload.decode(errors="replace") or "refused")
            if kind == REFUSE:
                self.drop(f"the router refused this tunnel: {self.admitted}")
        elif kind == OPEN and not self.opener and self._on_open is not None:
            self._accept(sid, payload)
        elif kind in (ACCEPT, REFUSE) and self.opener:
            waiter = self._opening.pop(sid, None)
            if waiter is not None and not waiter.done():
                if kind == ACCEPT:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(TunnelError(payload.decode(errors="replace")))
        else:
            self.drop(f"an unexpected frame (type {kind}) from the other end")

    def _accept(self, sid: int, payload: bytes) -> None:
        stream = self.streams[sid] = Stream(self, sid)
        try:
            port = int(payload.decode("ascii"))
        except ValueError:
            port = -1

        async def run() -> None:
            assert self._on_open is not None
            try:
                why = await self._on_open(stream, port) if 0 < port < 65536 else f"{payload[:40]!r} is not a port"
            except Exception as exc:  # a bug in the agent's forwarding must cost the stream, not the tunnel
                log.exception("tunnel stream %d to port %s", sid, port)
                why = f"the agent failed to open it: {exc}"
            if why:
                self.streams.pop(sid, None)
                stream.closed = True
                self.send(REFUSE, sid, why.encode()[:1024])
            elif not stream.closed:
                self.send(ACCEPT, sid)

        task = self._loop.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def send(self, kind: int, sid: int, payload: bytes = b"") -> None:
        if self.transport is not None and not self.lost:
            self.transport.write(_HEAD.pack(kind, sid, len(payload)) + payload)

    async def open(self, port: int, timeout_s: float) -> Stream:
        """A new stream to the engine on ``port`` of the agent's node; ``TunnelError`` says why not."""
        if self.lost:
            raise TunnelError(self.why_lost)
        sid = self._next
        self._next += 2
        stream = self.streams[sid] = Stream(self, sid)
        waiter = self._opening[sid] = self._loop.create_future()
        self.send(OPEN, sid, str(port).encode())
        try:
            async with asyncio.timeout(timeout_s or None):
                await waiter
        except TimeoutError:
            self._opening.pop(sid, None)
            stream.close("no answer in time")
            raise TunnelError(f"the agent did not open a stream to port {port} within {timeout_s:g}s") from None
        except BaseException:
            self._opening.pop(sid, None)
            self.streams.pop(sid, None)
            stream.closed = True
            raise
        return stream

    # -- liveness --

    def _tick(self) -> None:
        self._ticker = None
        if self.lost:
            return
        if self._loop.time() - self.heard > DEAD_S:
            self.drop(f"nothing heard for {DEAD_S:g}s (the link is down?)")
            return
        if self.opener:
            self.send(PING, 0)
        self._ticker = self._loop.call_later(PING_S, self._tick)

    def drop(self, why: str) -> None:
        """Ends the tunnel now: every stream ends with ``why``."""
        if self.lost:
            return
        self.why_lost = why
        if self.transport is not None:
            self.transport.abort()
        self._gone(why)

    def _gone(self, why: str) -> None:
        if self.lost:
            return
        self.lost = True
        self.why_lost = why
        if self._ticker is not None:
            self._ticker.cancel()
        for waiter in self._opening.values():
            if not waiter.done():
                waiter.set_exception(TunnelError(why))
        self._opening.clear()
        for stream in list(self.streams.values()):
            stream.ended(why)
        self.streams.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._on_lost is not None:
            self._on_lost(self, why)
