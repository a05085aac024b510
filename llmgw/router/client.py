"""The router's HTTP/1.1 client to engines: keep-alive pools on ``asyncio.Protocol`` and httptools.

aiohttp's client cost more per request than everything else the router does
(profiled at 3.4k-7.5k req/s on one core: request objects, header
multidicts, a writer and a stream reader per request). Here a request is one
``transport.write`` of precomputed head bytes plus the body, and the response
is parsed by httptools into a ``Response`` whose body chunks are handed over
as they arrive. What relay reads of it is what it read of aiohttp's:
``status``, ``headers.get``, ``content.readany``/``iter_any``, ``read``,
``close``.

The response and the errors (``ClientError`` and one subclass per failure the Forwarder treats
differently) are in ``response``; this module names them too, for its callers.

Timeouts are per read, as aiohttp's ``sock_read`` was: each arriving byte
restarts the wait. There is no timer per request: each connection notes when
bytes last came, and one ticker per pool (every quarter of the shortest read
timeout, at most a second) fails the busy connections past their timeout. A
timer per request cost more than parsing its response.

A connection goes back to its pool when its response has been read to the end
and both sides said keep-alive; anything else (a close before the end, an
error, a cancel) closes it, which is what tells the engine to stop generating.
A response's body is buffered up to ``response._HIGH_WATER`` before reading from the
engine pauses, so a slow client slows its engine rather than growing the router's memory.

An ``https://`` engine the route table gives a CA for (``expect``: ``enginetls.Expected`` by URL) is
verified when a connection to it is made, before the request is written: a certificate that is not
the cluster CA's engine certificate for its node fails the connect with ``TlsRefused``. Pool keys carry
the expectation, so a connection is only reused for what it was verified for; plain ``http://`` pays
nothing for it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_mod
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Protocol

import httptools

from llmgw.api import tunnel
from llmgw.router import enginetls
from llmgw.router.response import (
    BodyError,
    ClientError,
    ConnectFailed,
    Disconnected,
    Headers,
    ReadTimeout,
    Response,
    TlsRefused,
)

__all__ = ["BodyError", "ClientError", "ConnectFailed", "Connection", "Disconnected", "Headers", "Pool",
           "ReadTimeout", "Response", "TlsRefused"]

#: A pool key: host, port, TLS, for a verified engine what it must present (None: nothing checked), and the node
#: whose tunnel reaches it ("": none, a socket; ``api.tunnel.url``).
Key = tuple[str, int, bool, enginetls.Expected | None, str]


class Tunnels(Protocol):
    """What reaches a tunnelled engine (``router.tunnel.hub.TunnelHub``)."""
    async def connect(self, node: str, port: int, factory: Callable[[], asyncio.Protocol]) -> asyncio.Protocol: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one request at a time."""

    def __init__(self, pool: Pool, key: Key) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers = Headers()
        self._header_name = b""
        self._delimited = False  # the body has a length or is chunked (else it ends at EOF)
        self._waiter: asyncio.Future[Response] | None = None
        self._response: Response | None = None
        self._busy = False
        self._paused = False
        self._read_timeout = 0.0
        self._activity = 0.0
        self._loop = asyncio.get_running_loop()
        self.lost = False

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._busy:
            # Bytes nobody asked for (a late answer to an abandoned request): not ours to read.
            self._close()
            return
        self._activity = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BodyError(f"malformed HTTP response: {exc}") if self._response is not None
                       else Disconnected(f"malformed HTTP response: {exc}"))
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._pool._forget(self)
        if self._response is not None and not self._delimited and exc is None:
            self._response._finish()  # a body without length or chunking ends at EOF
            self._response = None
            return
        why = str(exc) if exc else "the engine closed the connection"
        self._fail(BodyError(why) if self._response is not None else Disconnected(why))

    # -- httptools callbacks --

    def on_header(self, name: bytes, value: bytes) -> None:
        if name:
            self._header_name = name
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        else:  # a value continued over two callbacks
            key = self._header_name.decode("latin-1").lower()
            self._headers[key] += value.decode("latin-1")

    def on_headers_complete(self) -> None:
        headers = self._headers
        self._delimited = "content-length" in headers or "transfer-encoding" in headers
        status = self._parser.get_status_code()
        if status < 200:  # an interim 1xx: the real answer follows
            self._headers = Headers()
            return
        response = self._response = Response(status, headers, self)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        response = self._response
        if response is None:
            return  # the end of a 1xx
        self._response = None
        self._busy = False
        keep = self._parser.should_keep_alive() and response.connection is self
        response.connection = None
        response._finish()
        if keep:
            self._resume()
            self._pool._idle(self)
        else:
            self._close()

    # -- used by the pool and the response --

    def send(self, head: bytes, body: bytes, read_timeout: float) -> asyncio.Future[Response]:
        assert self.transport is not None
        self._busy = True
        self._headers = Headers()
        self._waiter = waiter = self._loop.create_future()
        self._read_timeout = read_timeout
        self._activity = self._loop.time()
        if len(body) < 16384:
            self.transport.write(head + body)  # one segment, one syscall
        else:
            self.transport.write(head)
            self.transport.write(body)
        return waiter

    def set_read_timeout(self, seconds: float) -> None:
        self._read_timeout = seconds
        self._activity = self._loop.time()
        self._pool._tick_within(seconds)

    def check_timeout(self, now: float) -> None:
        """Called by the pool's ticker: fail the request if no byte came within the read timeout."""
        if not self._busy or self._read_timeout <= 0 or now - self._activity < self._read_timeout:
            return
        self._fail(ReadTimeout(f"no response within {self._read_timeout:g}s") if self._response is None
                   else BodyError(f"no data for {self._read_timeout:g}s"))
        self._close()

    def _fail(self, error: ClientError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        response, self._response = self._response, None
        if response is not None:
            response._finish(error)
        self._busy = False

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        self._resume()

    def _resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def abandon(self) -> None:
        """The response will not be read to its end: close, so the engine stops."""
        self._response = None
        self._busy = False
        self._close()

    def _close(self) -> None:
        self._pool._forget(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()


class Pool:
    """Keep-alive connections per engine address; ``fresh=True`` asks for a new one."""

    def __init__(self, *, connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle_conns: dict[Key, list[Connection]] = {}
        self._all: set[Connection] = set()
        self._targets: dict[str, tuple[Key, bytes, str]] = {}
        # (url, path, header lines) -> the request head up to Content-Length, built once.
        self._heads: dict[tuple[str, str, bytes], bytes] = {}
        self._ssl: ssl_mod.SSLContext | None = None
        self._expect: Mapping[str, enginetls.Expected] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._tick_s = 1.0
        self._tick_within(read_timeout_s)
        #: Engines of nodes behind NAT, reached through their tunnels (issue 33); None: no tunnel port here.
        self.tunnels: Tunnels | None = None

    def _tick_within(self, timeout_s: float) -> None:
        """Make the ticker run often enough for ``timeout_s``: every quarter of it, at most each second."""
        if timeout_s > 0:
            self._tick_s = min(self._tick_s, max(0.01, timeout_s / 4))

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in list(self._all):
            connection.check_timeout(now)
        self._ticker = loop.call_later(self._tick_s, self._tick) if self._all else None

    def expect(self, expected: Mapping[str, enginetls.Expected]) -> None:
        """The ``https://`` engines to verify from now on, by URL (``enginetls.expectations``, per table).

        Idle connections verified for an expectation that is gone are closed; busy ones are not reused.
        """
        if expected == self._expect:
            return
        self._expect = expected
        self._targets.clear()  # their keys carry the expectation
        live = {id(e) for e in expected.values()}
        for key, idle in list(self._idle_conns.items()):
            if key[3] is not None and id(key[3]) not in live:
                for connection in list(idle):
                    connection.abandon()

    def target(self, url: str) -> tuple[Key, bytes, str]:
        """(address, Host header value, path prefix) of a base URL, parsed once."""
        found = self._targets.get(url)
        if found is None:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConnectFailed(f"cannot reach {url!r}: only http:// and https:// URLs with a host work")
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            expect = self._expect.get(url) if tls else None
            via = tunnel.node_of(parts.netloc)
            found = self._targets[url] = ((parts.hostname, port, tls, expect, via[0] if via else ""),
                                          parts.netloc.encode("idna"), parts.path.rstrip("/"))
        return found

    async def request(self, url: str, path: str, head_lines: bytes, body: bytes, *,
                      fresh: bool = False) -> Response:
        """POST ``body`` to ``url + path``; ``head_lines`` are extra header lines, each ending CRLF."""
        start = self._heads.get((url, path, head_lines))
        if start is None:
            key, host, prefix = self.target(url)
            if len(self._heads) > 4096:  # endpoints come and go; the cache must not grow for ever
                self._heads.clear()
            start = self._heads[(url, path, head_lines)] = b"".join(
                (b"POST ", (prefix + path).encode(), b" HTTP/1.1\r\nHost: ", host, b"\r\n", head_lines))
        key = self.target(url)[0]
        connection = None if fresh else self._take(key)
        if connection is None:
            connection = await self._connect(key, url)
        waiter = connection.send(start + b"Content-Length: %d\r\n\r\n" % len(body), body, self.read_timeout_s)
        try:
            return await waiter
        except asyncio.CancelledError:
            connection.abandon()  # the client left before the engine answered: stop the engine
            raise

    async def get(self, url: str, path: str, head_lines: bytes) -> tuple[int, bytes]:
        """GET ``url + path`` on a pooled connection: status and body (the load scraper's, for verified engines)."""
        key, host, prefix = self.target(url)
        connection = self._take(key) or await self._connect(key, url)
        waiter = connection.send(b"".join((b"GET ", (prefix + path).encode(), b" HTTP/1.1\r\nHost: ", host, b"\r\n",
                                           head_lines, b"\r\n")), b"", self.read_timeout_s)
        try:
            response = await waiter
        except asyncio.CancelledError:
            connection.abandon()
            raise
        try:
            return response.status, await response.read()
        finally:
            response.close()

    def _take(self, key: Key) -> Connection | None:
        idle = self._idle_conns.get(key)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
        return None

    async def _connect(self, key: Key, url: str) -> Connection:
        host, port, tls, expect, via = key
        if via:
            return await self._through(key, via, port, url)
        loop = asyncio.get_running_loop()
        context: ssl_mod.SSLContext | None = None
        if expect is not None:
            if expect.context is None:
                raise TlsRefused(expect.broken)
            context = expect.context
        elif tls:
            if self._ssl is None:
                self._ssl = ssl_mod.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s or None):
                _, protocol = await loop.create_connection(lambda: Connection(self, key), host, port, ssl=context)
        except TimeoutError:
            raise ConnectFailed(f"cannot connect to {url}: no connection within {self.connect_timeout_s:g}s") \
                from None
        except ssl_mod.SSLError as exc:
            if expect is not None:
                raise TlsRefused(expect.handshake_failed(exc)) from None
            raise ConnectFailed(f"cannot connect to {url}: {exc.strerror or exc}") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {url}: {exc.strerror or exc}") from None
        transport = protocol.transport
        if expect is not None and (why := expect.check(transport)):
            protocol.abandon()  # closed before a byte of the request (its prompt, the engine's key) is written
            raise TlsRefused(why)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without TCP_NODELAY, Nagle holds a small request until the engine's delayed
            # ACK: about 40 ms added to every first token.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._track(protocol)

    def _track(self, protocol: Connection) -> Connection:
        """A new connection, counted and watched by the ticker."""
        self._all.add(protocol)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(self._tick_s, self._tick)
        return protocol

    async def _through(self, key: Key, node: str, port: int, url: str) -> Connection:
        """A connection to a tunnelled engine: a stream of its node's tunnel (the tunnel is TLS already)."""
        if self.tunnels is None:
            raise ConnectFailed(f"cannot connect to {url}: the engine is behind its node's tunnel, and this router "
                                "has no tunnel port (the control plane's in-process router serves such replicas)")
        try:
            async with asyncio.timeout(self.connect_timeout_s or None):
                protocol = await self.tunnels.connect(node, port, lambda: Connection(self, key))
        except TimeoutError:
            raise ConnectFailed(f"cannot connect to {url}: no stream within {self.connect_timeout_s:g}s") from None
        assert isinstance(protocol, Connection)
        return self._track(protocol)

    def _idle(self, connection: Connection) -> None:
        if connection.usable():
            self._idle_conns.setdefault(connection.key, []).append(connection)

    def _forget(self, connection: Connection) -> None:
        idle = self._idle_conns.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)
        self._all.discard(connection)

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        for connection in list(self._all):
            connection.abandon()
        self._all.clear()
        self._idle_conns.clear()
