"""An engine's response as the router's HTTP client hands it over, and the client's errors.

``Response`` has its status and headers read; its body chunks are fed by the connection (``client``)
as they arrive and read by the relay (``readany``, ``iter_any``, ``read``: what relay read of
aiohttp's response). Bodies are buffered up to ``_HIGH_WATER`` before reading from the engine pauses,
so a slow client slows its engine rather than growing the router's memory.

Its public hooks are the Forwarder's (``upstream``): ``on_done`` (the response is done with: closed,
released or read to the end; the replica's request is no longer in flight), ``on_first_byte`` (the
first token is back: a policy's ``done``) and ``idle_timeout_s`` (the read timeout once the body
started, ``body_started``).

Errors are ``ClientError`` subclasses, one per failure the Forwarder treats
differently (``upstream`` explains the retry rules):

* ``ConnectFailed``: refused or timed out before a connection existed; ``TlsRefused``, one of them:
  the engine's certificate is not the cluster CA's engine certificate for its node (``enginetls``);
* ``Disconnected``: the connection closed or reset before the response's
  headers, what a pooled connection the engine has dropped looks like;
* ``ReadTimeout``: no byte within the read timeout (first byte, then idle);
* ``BodyError``: the connection ended or broke in the middle of a body.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.router.client import Connection

_HIGH_WATER = 1 << 18  # body bytes buffered before the engine connection is paused


class ClientError(Exception):
    """Reaching an engine failed; the message says how."""


class ConnectFailed(ClientError):
    """No connection: refused, unreachable, or not made within the connect timeout."""


class TlsRefused(ConnectFailed):
    """An engine failed TLS verification (``enginetls``): not the cluster CA's engine certificate for its node."""


class Disconnected(ClientError):
    """The engine closed or reset the connection before the response's headers."""


class ReadTimeout(ClientError):
    """No byte from the engine within the read timeout."""


class BodyError(ClientError):
    """The body ended early or the connection broke while it was being read."""


class Headers(dict[str, str]):
    """Response headers with lower-case names; ``get`` looks up any case, as aiohttp's did."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name.lower() if isinstance(name, str) else name)


class Response:
    """An engine's response: status and headers read, the body still arriving on ``connection``.

    It is also its own ``content`` (``readany``, ``iter_any``, ``read``), so relay code
    written against aiohttp's ``response.content`` reads it unchanged.
    """

    __slots__ = ("status", "headers", "connection", "_chunks", "_size", "_eof", "_error", "_waiter",
                 "_done", "_closed", "on_done", "idle_timeout_s", "on_first_byte")

    def __init__(self, status: int, headers: Headers, connection: Connection) -> None:
        self.status = status
        self.headers = headers
        self.connection: Connection | None = connection
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        #: Hook: called once when the response is done with (closed, released, or read to the end).
        self.on_done: Callable[[], None] | None = None
        #: The read timeout ``body_started`` switches to (None: the first-byte one stays).
        self.idle_timeout_s: float | None = None
        #: Hook: called once, by ``body_started`` (the first token is back) or when the response is done.
        self.on_first_byte: Callable[[], None] | None = None

    @property
    def content(self) -> Response:
        return self

    # -- fed by the connection --

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > _HIGH_WATER and self.connection is not None:
            self.connection.pause()
        self._wake()

    def _finish(self, error: BaseException | None = None) -> None:
        if error is not None and not self._eof:
            self._error = error
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- read by the relay --

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        if len(chunks) != 0:
            chunks.clear()
        self._size = 0
        if self.connection is not None:
            self.connection.resume()
        return data

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readany(self) -> bytes:
        """What has arrived since the last read, waiting for something; b"" at the end."""
        while not self._chunks:
            if self._eof:
                if self._error is not None:
                    raise self._error
                self._ended()
                return b""
            await self._wait()
        return self._take()

    async def wait_any(self, timeout: float) -> bytes | None:
        """As ``readany``, but None once ``timeout`` passes with nothing new; the read itself goes on."""
        if self._chunks or self._eof:
            return await self.readany()
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout, self._wake)
        try:
            await self._wait()
        finally:
            timer.cancel()
        if self._chunks or self._eof:
            return await self.readany()
        return None

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk

    async def read(self, limit: int = -1) -> bytes:
        """The whole body (or up to ``limit`` bytes of it, for an error snippet)."""
        if limit < 0 and self._eof and self._error is None:
            # The usual whole answer: it arrived with its headers, nothing to wait for.
            data = self._take() if self._chunks else b""
            self._ended()
            return data
        parts: list[bytes] = []
        size = 0
        while limit < 0 or size < limit:
            chunk = await self.readany()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return data if limit < 0 else data[:limit]

    def unread(self, data: bytes) -> None:
        """Put ``data`` back in front of what is still to be read (what a look ahead took and did not use)."""
        if data:
            self._chunks.appendleft(data)
            self._size += len(data)

    def arrived(self) -> bytes | None:
        """The whole body when all of it has arrived and none was read (a look that takes nothing); else None."""
        if not self._eof or self._error is not None:
            return None
        return b"".join(self._chunks)

    def ended(self) -> bool:
        """The body arrived whole and has all been read: the next read would say so."""
        return self._eof and not self._chunks and self._error is None

    def set_read_timeout(self, seconds: float) -> None:
        if self.connection is not None:
            self.connection.set_read_timeout(seconds)

    def body_started(self) -> None:
        """The body's first chunk arrived: ``on_first_byte`` runs, the read timeout becomes ``idle_timeout_s``.

        Calling it again is harmless.
        """
        first = self.on_first_byte
        if first is not None:
            self.on_first_byte = None
            first()
        if self.idle_timeout_s is not None:
            self.set_read_timeout(self.idle_timeout_s)  # rescheduled now, not on the next packet

    def _ended(self) -> None:
        """Read to the end: the connection was handed back at its message end; run the hooks."""
        self._release_hook()

    def _release_hook(self) -> None:
        first, self.on_first_byte = self.on_first_byte, None
        if first is not None:
            first()
        done, self.on_done = self.on_done, None
        if done is not None:
            done()

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        """Done with the response: before its end this closes the connection (the engine stops)."""
        if not self._closed:
            self._closed = True
            connection, self.connection = self.connection, None
            if connection is not None and not self._eof:
                connection.abandon()
            self._chunks.clear()
        self._release_hook()

    @property
    def closed(self) -> bool:
        return self._closed
