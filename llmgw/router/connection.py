"""One client connection of the router's HTTP server: reading its requests, running the app on each.

Requests are parsed by httptools into a small ASGI scope (with the ``asgi.CANCELS`` extension) and
run in one task each, pipelined ones queued and answered in order; the answer is written by
``httphead.ResponseWriter``. Reading is bounded by ``limits.Limits`` (one timer per request that
arrives in parts, never touched per byte); a client's disconnect cancels its request's task.
``server`` explains the whole.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import deque
from typing import TYPE_CHECKING, Any

import httptools

from llmgw.router import errors, httphead
from llmgw.router.asgi import CANCELS

if TYPE_CHECKING:
    from llmgw.router.server import Server

log = logging.getLogger(__name__)


class Connection(httphead.ResponseWriter, asyncio.Protocol):
    """One client connection; requests on it are answered one at a time, in order (``ResponseWriter`` writes them)."""

    #: The scope's ``scheme``: a class attribute, so a plain connection pays nothing for TLS (``TlsConnection``).
    scheme = "http"

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
                 "method": self.parser.get_method().decode("ascii"), "scheme": self.scheme, "path": path,
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
            await self.server.http_app(scope, self._receive, self._send)
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

    def take_body(self) -> bytes | None:
        """The request's body, read whole already, without a ``receive`` message (``asgi.read_body``); None once
        taken."""
        if self._delivered:
            return None
        self._delivered = True
        body, self._request_body = self._request_body, b""
        return body

    async def _receive(self) -> dict[str, Any]:
        if not self._delivered:
            self._delivered = True
            body, self._request_body = self._request_body, b""
            return {"type": "http.request", "body": body, "more_body": False}
        if not self._lost and not self._complete:
            self._gone = self._loop.create_future()
            await self._gone
        return {"type": "http.disconnect"}

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


class TlsConnection(Connection):
    """A connection of a TLS listener (``asyncio`` decrypts beneath it): the same, with the scheme ``https``."""

    scheme = "https"
