"""The standalone router's HTTP/1.1 server: ``asyncio.Protocol`` and httptools, running the ASGI app.

uvicorn's per-request machinery (its request-response cycle object, the
message-event dance, the header validation, middleware wrappers) cost more
than the router's own work at capacity. This server does what the router
needs and nothing else: parse with httptools, build a small ASGI scope, run
the app in one task per request, and turn each ``send`` into one
``transport.write`` of precomputed bytes (the status line and the date are
cached; a whole body goes out with its head in one write).

What it keeps of an HTTP/1.1 server: keep-alive (closed after
``limits.idle_timeout_s`` idle), pipelined requests answered in order, chunked transfer
encoding for a body sent in parts (a stream), ``Connection: close`` and
HTTP/1.0, ``Expect: 100-continue``, ``HEAD`` without a body, write flow control
(``send`` waits while the client's socket buffer is full), a 413 as soon as a
body passes ``max_body_bytes``, a 400 for a malformed request, a 500 when the
app fails before it answered.

Reading a request is bounded (``limits.Limits``): its header block must be complete within
``header_timeout_s`` of its first byte, and its body may pause at most ``body_timeout_s``; past either
the client gets a 408 and the connection is closed. One timer per request that arrives in parts, armed
after a read leaves a request incomplete and never touched per byte (a request that arrives whole, the
usual case, arms none); it looks at the time of the last read when it fires and re-arms if the body
moved. Answering is not bounded: an SSE stream may run for minutes. One client address may hold
``max_per_address`` connections; the next is answered 503 and closed at once.

A client's disconnect cancels its request's task at once, which is how the
router stops the engine (the relay closes the upstream connection when
cancelled). The scope says so with the ``app.CANCELS`` extension, and
``receive()`` also answers ``http.disconnect`` for apps that watch for it.

``shutdown()`` stops listening, closes idle connections, lets requests in
flight finish for the grace period and then cancels them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.parse
from collections import deque
from typing import Any

import httptools

from llmgw.router import asgi, errors, httphead
from llmgw.router.app import CANCELS
from llmgw.router.limits import AddressCounts, Limits

log = logging.getLogger(__name__)


class Server:
    """Serves ``app`` (an ASGI callable) on one or more listening sockets."""

    def __init__(self, app: Any, *, max_body_bytes: int = 32 << 20, limits: Limits = Limits()) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.keepalive_s = limits.idle_timeout_s
        self.addresses = AddressCounts(limits.max_per_address)
        self.clock = httphead.Clock()
        self.connections: set[_Connection] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        return self._started(await loop.create_server(lambda: _Connection(self), host, port, backlog=2048))

    async def start_on(self, sock: socket.socket) -> asyncio.AbstractServer:
        """Serve on ``sock``, a listening socket already bound (its port known before the server starts)."""
        loop = asyncio.get_running_loop()
        return self._started(await loop.create_server(lambda: _Connection(self), sock=sock, backlog=2048))

    def _started(self, server: asyncio.AbstractServer) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        self._servers.append(server)
        if self._sweeper is None and self.keepalive_s > 0:
            self._sweeper = loop.call_later(1.0, self._sweep)
        return server

    def _sweep(self) -> None:
        """Close keep-alive connections idle for longer than ``keepalive_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() - self.keepalive_s
        for connection in list(self.connections):
            if connection.idle_since and connection.idle_since < deadline:
                connection.close()
        self._sweeper = loop.call_later(1.0, self._sweep)

    async def shutdown(self, grace_s: float = 30.0) -> None:
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self.connections):
            connection.closing = True
            if connection.task is None:
                connection.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            log.info("waiting up to %gs for %d request(s) in flight", grace_s, len(busy))
            _, pending = await asyncio.wait(busy, timeout=grace_s)
            if pending:
                log.warning("cutting %d request(s) still in flight after %gs", len(pending), grace_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        for connection in list(self.connections):
            connection.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()


class _Connection(asyncio.Protocol):
    """One client connection; requests on it are answered one at a time, in order."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.task: asyncio.Task[None] | None = None
        self.idle_since = 0.0  # loop time the connection went idle; 0 while a request is open
        self.closing = False  # shutting down: close after the current response
        self._loop = asyncio.get_running_loop()
        self._lost = False
        self._client: tuple[str, int] | None = None
        self._server_addr: tuple[str, int] | None = None
        self._queue: deque[tuple[dict[str, Any], bytes, bool]] = deque()
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._gone: asyncio.Future[None] | None = None
        self._address = ""  # counted in server.per_address while not empty
        # Reading a request (``limits``): whether one is begun and not complete, whether its header block
        # is, the loop time its first read was seen (0: not yet) and of its last body read, and the timer.
        self._reading = False
        self._head_done = False
        self._read_started = 0.0
        self._body_at = 0.0
        self._read_timer: asyncio.TimerHandle | None = None
        self._reset_request()
        self._reset_response()

    def _reset_request(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._refused = False

    def _reset_response(self) -> None:
        self._status = 0
        self._response_headers: list[tuple[bytes, bytes]] = []
        self._head_sent = False
        self._chunked = False
        self._complete = False
        self._keep_alive = True
        self._head_only = False
        self._delivered = False

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        self.server.connections.add(self)
        self.idle_since = self._loop.time()
        peer = transport.get_extra_info("peername")
        self._client = tuple(peer[:2]) if isinstance(peer, tuple) else None  # type: ignore[assignment]
        sock = transport.get_extra_info("sockname")
        self._server_addr = tuple(sock[:2]) if isinstance(sock, tuple) else None  # type: ignore[assignment]
        addresses = self.server.addresses
        if addresses.cap and self._client is not None:
            if not addresses.take(self._client[0]):
                self._keep_alive = False
                self._refused = True
                self._write_error(503, errors.ApiError(503, addresses.refusal(self._client[0]),
                                                       type="service_unavailable", code="too_many_connections"))
                self.close()
                return
            self._address = self._client[0]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no upgrades here: the request is answered as plain HTTP
        except httptools.HttpParserError as exc:
            self._refuse(errors.invalid_request(f"The request is not valid HTTP/1.1: {exc}."))
            return
        if self._reading and not self._refused:  # a request is part read: it must keep arriving
            now = self._loop.time()
            if not self._read_started:
                self._read_started = now
            if self._head_done:
                self._body_at = now
            if self._read_timer is None:
                self._arm_read_timer(now)
        elif self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _arm_read_timer(self, now: float) -> None:
        wait = self._read_deadline() - now
        if wait != float("inf"):
            self._read_timer = self._loop.call_later(max(wait, 0.0), self._read_overdue)

    def _read_deadline(self) -> float:
        """When the request being read is overdue: its header block, else its body's next read (inf: never)."""
        lim = self.server.limits
        if not self._head_done:
            return self._read_started + lim.header_timeout_s if lim.header_timeout_s else float("inf")
        return self._body_at + lim.body_timeout_s if lim.body_timeout_s else float("inf")

    def _read_overdue(self) -> None:
        self._read_timer = None
        if not self._reading or self._lost or self._refused:
            return
        now = self._loop.time()
        if len(self._queue) > 16:  # reading is paused behind pipelined requests: our wait, not the client's
            self._read_started = self._body_at = now
        if now < self._read_deadline():  # the headers completed, or the body moved, since it was armed
            self._arm_read_timer(now)
            return
        lim = self.server.limits
        what = (f"its headers within {lim.header_timeout_s:g} s of its first byte" if not self._head_done
                else f"its body with no pause over {lim.body_timeout_s:g} s")
        log.info("closing a connection from %s: the request did not send %s", self._client, what)
        self._refuse(errors.ApiError(408, f"The request did not send {what}; the connection is closed. Send the "
                                          "whole request at once.", type="invalid_request_error",
                                     code="request_timeout"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.server.connections.discard(self)
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self._address:
            self.server.addresses.give(self._address)
            self._address = ""
        self._queue.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        if self.task is not None and not self._complete:
            self.task.cancel()  # the client left: the relay closes its upstream connection

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks --

    def on_message_begin(self) -> None:
        self.idle_since = 0.0
        self._reading = True
        self._head_done = False
        self._read_started = 0.0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._head_done = True
        for name, value in self._headers:
            if name == b"expect" and value.lower() == b"100-continue" and self.transport is not None:
                self.transport.write(httphead.CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.server.max_body_bytes:
            self._refuse(errors.body_too_large(self.server.max_body_bytes))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._reading = False
        if self._refused:
            return
        url = self._url
        if b"?" in url or b"%" in url:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
            path = urllib.parse.unquote(raw_path.decode("latin-1"))
        else:
            raw_path, query, path = url, b"", url.decode("latin-1")
        version = self.parser.get_http_version()
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
                 "method": self.parser.get_method().decode("ascii"), "scheme": "http", "path": path,
                 "raw_path": raw_path, "query_string": query, "root_path": "", "headers": self._headers,
                 "client": self._client, "server": self._server_addr, "extensions": {CANCELS: {}}}
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        keep_alive = self.parser.should_keep_alive()
        self._reset_request()
        if self.task is None:
            self._start(scope, body, keep_alive)
        else:  # pipelined behind the request being answered
            self._queue.append((scope, body, keep_alive))
            if len(self._queue) > 16 and self.transport is not None:
                self.transport.pause_reading()

    # -- running a request --

    def _start(self, scope: dict[str, Any], body: bytes, keep_alive: bool) -> None:
        self._reset_response()
        self._keep_alive = keep_alive and not self.closing
        self._head_only = scope["method"] == "HEAD"
        self._http10 = scope["http_version"] == "1.0"
        self._request_body = body
        self.task = self._loop.create_task(self._run(scope))

    async def _run(self, scope: dict[str, Any]) -> None:
        try:
            await self.server.app(scope, self._receive, self._send)
        except asyncio.CancelledError:
            if not self._lost:  # cancelled at shutdown, not by the client's leaving
                self._keep_alive = False
                if not self._head_sent:
                    self._write_error(503, errors.ApiError(503, "The router is shutting down; retry.",
                                                           type="service_unavailable", code="shutting_down"))
        except Exception:
            log.exception("the router failed on %s %s", scope["method"], scope["path"])
            self._keep_alive = False
            if not self._head_sent:
                self._write_error(500, errors.ApiError(500, "The router failed on this request; see its log.",
                                                       type="internal_error", code="internal_error"))
        finally:
            self.task = None
            self._done()

    def _done(self) -> None:
        if self._lost or self.transport is None:
            return
        if not self._complete:
            if self._head_sent:  # the app returned mid-response: the client must not wait for more
                self.close()
                return
            self._write_error(500, errors.ApiError(500, "The router sent no answer to this request.",
                                                   type="internal_error", code="internal_error"))
        if not self._keep_alive:
            self.close()
            return
        if self._queue:
            scope, body, keep_alive = self._queue.popleft()
            if len(self._queue) <= 16:
                self.transport.resume_reading()
            self._start(scope, body, keep_alive)
        else:
            self.idle_since = self._loop.time()

    async def _receive(self) -> dict[str, Any]:
        if not self._delivered:
            self._delivered = True
            body, self._request_body = self._request_body, b""
            return {"type": "http.request", "body": body, "more_body": False}
        if not self._lost and not self._complete:
            self._gone = self._loop.create_future()
            await self._gone
        return {"type": "http.disconnect"}

    async def _send(self, message: asgi.Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._head_sent or self._status:
                raise RuntimeError("http.response.start sent twice")
            self._status = message["status"]
            self._response_headers = message.get("headers", [])
            return
        if kind != "http.response.body":
            return
        if self._lost or self._complete or self.transport is None:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if not self._head_sent:
            data = self._head(body, more)
        else:
            data = b"" if self._head_only else (b"%x\r\n%s\r\n" % (len(body), body) if self._chunked and body
                                                else body if not self._chunked else b"")
        if not more:
            self._complete = True
            if self._chunked and not self._head_only:
                data += httphead.LAST_CHUNK
        if data:
            self.transport.write(data)
        if not more and self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        if self._paused and not self._lost:
            self._drain = self._loop.create_future()
            await self._drain

    def _head(self, body: bytes, more: bool) -> bytes:
        if not self._status:
            raise RuntimeError("http.response.body sent before http.response.start")
        self._head_sent = True
        parts = [httphead.status_line(self._status)]
        has_length = False
        for name, value in self._response_headers:
            lowered = name.lower()
            if lowered == b"content-length":
                has_length = True
            elif lowered == b"connection" and value.lower() == b"close":
                self._keep_alive = False
            parts += (name, b": ", value, b"\r\n")
        if not has_length:
            if not more:
                parts.append(b"content-length: %d\r\n" % len(body))
            elif self._http10:
                self._keep_alive = False  # no chunking in HTTP/1.0: the body ends with the connection
            else:
                self._chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
        if not self._keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(self.server.clock.date())
        parts.append(b"\r\n")
        if not self._head_only and body:
            parts.append(b"%x\r\n%s\r\n" % (len(body), body) if self._chunked else body)
        return b"".join(parts)

    def _write_error(self, status: int, error: errors.ApiError) -> None:
        if self.transport is None or self._lost:
            return
        body = error.body()
        head = (httphead.status_line(status) + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
                + (b"" if self._keep_alive else b"connection: close\r\n") + self.server.clock.date() + b"\r\n")
        self.transport.write(head if self._head_only else head + body)
        self._head_sent = self._complete = True

    def _refuse(self, error: errors.ApiError) -> None:
        """Answer ``error`` and close: what follows on this connection cannot be parsed or is unwanted."""
        self._refused = True
        self._queue.clear()
        if self.task is None:
            self._reset_response()
            self._keep_alive = False
            self._write_error(error.status, error)
        self.closing = True
        self._keep_alive = False
        if self.task is None:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
