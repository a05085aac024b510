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
cancelled). The scope says so with the ``asgi.CANCELS`` extension, and
``receive()`` also answers ``http.disconnect`` for apps that watch for it.

``shutdown()`` stops listening, closes idle connections, lets requests in
flight finish for the grace period and then cancels them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from llmgw.router import httphead
from llmgw.router.connection import Connection, TlsConnection
from llmgw.router.limits import AddressCounts, Limits

log = logging.getLogger(__name__)


class Server:
    """Serves ``app`` (an ASGI callable) on one or more listening sockets."""

    def __init__(self, app: Any, *, max_body_bytes: int = 32 << 20, limits: Limits = Limits(),
                 marks: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """``marks``: headers on every answer (``httphead.HSTS`` on TLS, ``httphead.PLAIN_HTTP_MARK``), cached with
        the date line (``httphead.Clock``): no work per answer."""
        self.app = app
        # An app that serves HTTP through a method of its own (``RouterApp.asgi_http``) is called there, one
        # coroutine layer fewer for every resume of every request (issue 27); anything else as ASGI says.
        self.http_app = getattr(app, "asgi_http", app)
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.keepalive_s = limits.idle_timeout_s
        self.addresses = AddressCounts(limits.max_per_address)
        self.clock = httphead.Clock(marks)
        self.connections: set[Connection] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False,
                    ssl: ssl.SSLContext | None = None) -> asyncio.AbstractServer:
        """Listen on ``host:port``; ``reuse_port``: with SO_REUSEPORT, so the router's workers (``router.hub``)
        each listen on the same port and the kernel spreads new connections over them. ``ssl``: HTTPS with this
        server context (``tlslisten.CertReloader.context``; its certificate may be replaced while serving)."""
        loop = asyncio.get_running_loop()
        return self._started(await loop.create_server(self._protocol(ssl), host, port, backlog=2048,
                                                      reuse_port=reuse_port or None, **self._tls(ssl)))

    async def start_on(self, sock: socket.socket, *, ssl: ssl.SSLContext | None = None) -> asyncio.AbstractServer:
        """Serve on ``sock``, a listening socket already bound (its port known before the server starts)."""
        loop = asyncio.get_running_loop()
        return self._started(await loop.create_server(self._protocol(ssl), sock=sock, backlog=2048,
                                                      **self._tls(ssl)))

    def _protocol(self, ctx: ssl.SSLContext | None) -> Any:
        # One class per listener, chosen here: the scope's scheme is a class attribute, not a test per request.
        # Nagle stays off on TLS too: the event loop sets TCP_NODELAY on the socket beneath the TLS layer.
        kind = Connection if ctx is None else TlsConnection
        return lambda: kind(self)

    def _tls(self, ctx: ssl.SSLContext | None) -> dict[str, Any]:
        if ctx is None:
            return {}
        # A handshake is bounded as a request's header block is: a client that opens and stalls holds nothing long.
        return {"ssl": ctx, "ssl_handshake_timeout": self.limits.header_timeout_s or 60.0}

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
