"""Response-head bytes the router's HTTP server writes, precomputed, and the writing of an ASGI response.

Status lines are built once, the date once a second (``Clock``). ``ResponseWriter`` turns an app's
``http.response.start`` and ``http.response.body`` messages into ``transport.write`` calls: the head
and a whole body in one write, a body sent in parts chunked (or, in HTTP/1.0, ended by closing the
connection), nothing after the head for ``HEAD``, and ``send`` waiting while the client's socket
buffer is full. ``server.Connection`` is one.
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import time
from typing import TYPE_CHECKING

from llmgw.router import asgi, errors

if TYPE_CHECKING:
    from llmgw.router.server import Server

STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
                for status in http.HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


#: On every answer of a TLS listener: browsers keep to HTTPS for this host for a year (``server.Server``'s marks).
HSTS = (b"strict-transport-security", b"max-age=31536000")
#: On every answer of ``llmgw server --plain-http`` (plain HTTP beyond loopback, behind a TLS proxy).
PLAIN_HTTP_MARK = (b"x-llmgw-plain-http", b"1")


class Clock:
    """The ``date`` header, formatted once a second rather than once a response.

    ``marks``: headers every answer carries (HSTS on a TLS listener), kept in the same cached bytes as the
    date, so they cost no work per answer: the line written is the same one object either way.
    """

    def __init__(self, marks: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        self.second = 0
        self.header = b""
        self._marks = b"".join(name + b": " + value + b"\r\n" for name, value in marks)

    def date(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.header = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n" + self._marks
        return self.header


class ResponseWriter:
    """The answering half of a server connection: one response at a time, written as the app sends it."""

    server: Server
    transport: asyncio.Transport | None
    _loop: asyncio.AbstractEventLoop
    _lost: bool
    _paused: bool
    _drain: asyncio.Future[None] | None
    _gone: asyncio.Future[None] | None
    _http10: bool

    def _reset_response(self) -> None:
        self._status = 0
        self._response_headers: list[tuple[bytes, bytes]] = []
        self._head_sent = False
        self._chunked = False
        self._complete = False
        self._keep_alive = True
        self._head_only = False
        self._delivered = False

    async def _send(self, message: asgi.Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._head_sent or self._status:
                raise RuntimeError("http.response.start sent twice")
            self._status = message["status"]
            self._response_headers = message.get("headers", [])
            return
        if kind == "http.response.body":
            await self.send_body(message.get("body", b""), message.get("more_body", False))

    async def send_body(self, body: bytes, more: bool) -> None:
        """What an ``http.response.body`` message does, called without one (``relay`` streams through it)."""
        if self._lost or self._complete or self.transport is None:
            return
        if not self._head_sent:
            data = self._head(body, more)
        else:
            data = b"" if self._head_only else (b"%x\r\n%s\r\n" % (len(body), body) if self._chunked and body
                                                else body if not self._chunked else b"")
        if not more:
            self._complete = True
            if self._chunked and not self._head_only:
                data += LAST_CHUNK
        if data:
            self.transport.write(data)
        if not more and self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        if self._paused and not self._lost:
            self._drain = self._loop.create_future()
            await self._drain

    async def send_whole(self, status: int, content_type: bytes, body: bytes,
                         extra: list[tuple[bytes, bytes]] | None) -> None:
        """A whole answer, head and body in one write: what ``asgi.send_bytes``'s two messages make, without them.

        ``extra``: headers besides the content type and length (never ``connection`` or ``content-length``:
        the router's own, such as ``x-llmgw-upstream`` and the ``x-ratelimit-*`` ones).
        """
        if self._head_sent or self._status:
            raise RuntimeError("http.response.start sent twice")
        self._status = status
        if self._lost or self.transport is None:
            return
        self._head_sent = self._complete = True
        parts = [status_line(status), b"content-type: ", content_type, b"\r\ncontent-length: %d\r\n" % len(body)]
        if extra:
            for name, value in extra:
                parts += (name, b": ", value, b"\r\n")
        if not self._keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (self.server.clock.date(), b"\r\n")
        if not self._head_only:
            parts.append(body)
        self.transport.write(b"".join(parts))
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        if self._paused and not self._lost:
            self._drain = self._loop.create_future()
            await self._drain

    def _head(self, body: bytes, more: bool) -> bytes:
        if not self._status:
            raise RuntimeError("http.response.body sent before http.response.start")
        self._head_sent = True
        parts = [status_line(self._status)]
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
        head = (status_line(status) + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
                + (b"" if self._keep_alive else b"connection: close\r\n") + self.server.clock.date() + b"\r\n")
        self.transport.write(head if self._head_only else head + body)
        self._head_sent = self._complete = True
