"""Reaching an engine: the router's only HTTP client, and its retry rules.

``Forwarder.open`` sends one request to one of a model's endpoints and returns
the engine's response as soon as its headers arrive, before any byte has gone to
the client. That is the only window in which a retry is safe, so every retry
lives here and the relay in ``app`` never retries:

* a refused or timed-out connect, or an HTTP 502/503 (or 401: the engine refused
  the router's key) from the engine: try the model's next endpoint (a replica that
  is stopping or still loading answers 503 for a moment);
* a reset or "server disconnected" on a pooled connection: retry the same engine
  once on a fresh connection first. xllamacpp's server closes the connection
  after a streamed response while still advertising keep-alive, so the pool
  hands out connections the engine has already dropped.

Foreign exceptions end here: a caller sees an open response or a 502 ``ApiError``
listing what each attempt met.
"""

from __future__ import annotations

import logging
import socket

import aiohttp

from llmgw.router import errors, pick
from llmgw.router.table import Endpoint, ModelRoute

log = logging.getLogger(__name__)

#: Statuses that mean "this engine cannot take it now", not "this request is bad". A 401
#: is the engine refusing the key the control plane gave the router, not the client's key
#: (which never reaches an engine): relayed, it would tell the client its own key is wrong.
RETRY_STATUSES = frozenset({401, 502, 503})


class _AttemptFailed(Exception):
    pass


def _nodelay_socket(addr_info: tuple) -> socket.socket:  # type: ignore[type-arg]
    # Without TCP_NODELAY, Nagle holds a small request or SSE write until the peer's
    # delayed ACK: about 40 ms added to every first token. aiohttp sets it too once the
    # connection is made; setting it here does not depend on that.
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Forwarder:
    """Owns the connection pools to engines and opens one upstream response per request."""

    def __init__(self, picker: pick.RoundRobin, *, connect_timeout_s: float = 5.0,
                 max_endpoints: int = 3) -> None:
        self._picker = picker
        self._max_endpoints = max_endpoints
        # No total or read timeout: a long generation may take minutes and a stream may
        # pause between tokens; the client's disconnect is what ends a request early.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        # Replica ids whose last attempt failed: a dead endpoint is logged when it starts
        # failing and when it answers again, not on every request that skips it.
        self._failing: set[str] = set()

    def _session(self, *, force_close: bool) -> aiohttp.ClientSession:
        # limit=0: aiohttp's default of 100 connections in all would queue the 101st
        # concurrent stream behind the others, invisibly, inside the router.
        connector = aiohttp.TCPConnector(limit=0, force_close=force_close, socket_factory=_nodelay_socket)
        # Bytes pass through as the engine sent them: no decompression, and no
        # Accept-Encoding that would invite the engine to compress a stream.
        return aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False,
                                     skip_auto_headers=("User-Agent", "Accept-Encoding"))

    async def start(self) -> None:
        if self._pooled is None:
            self._pooled = self._session(force_close=False)
            self._fresh = self._session(force_close=True)

    async def close(self) -> None:
        for session in (self._pooled, self._fresh):
            if session is not None:
                await session.close()
        self._pooled = self._fresh = None

    async def open(self, route: ModelRoute, path: str, body: bytes) -> tuple[Endpoint, aiohttp.ClientResponse]:
        """Send ``body`` to ``path`` on an endpoint of ``route``; the response has only its headers read."""
        if self._pooled is None:
            # Serving beats refusing: a host app that forgot startup() still works, and says so.
            log.warning("router used before startup(); opening its connection pools now")
            await self.start()
        tried: set[str] = set()
        attempts: list[str] = []
        while len(tried) < self._max_endpoints:
            endpoint = self._picker.pick(route.name, route.endpoints, exclude=tried)
            if endpoint is None:
                break
            tried.add(endpoint.replica_id)
            try:
                response = await self._send(endpoint, path, body)
            except _AttemptFailed as exc:
                attempts.append(f"{endpoint.replica_id} at {endpoint.url}: {exc}")
            else:
                if response.status not in RETRY_STATUSES:
                    if self._failing and endpoint.replica_id in self._failing:
                        self._failing.discard(endpoint.replica_id)
                        log.info("replica %s at %s answers again", endpoint.replica_id, endpoint.url)
                    return endpoint, response
                attempts.append(f"{endpoint.replica_id} at {endpoint.url}: HTTP {response.status} "
                                f"{await _snippet(response)}")
            if endpoint.replica_id not in self._failing:
                self._failing.add(endpoint.replica_id)
                log.warning("model %r: %s (not logged again until it answers)", route.name, attempts[-1])
        raise errors.upstream_failed(route.served_name, attempts)

    async def _send(self, endpoint: Endpoint, path: str, body: bytes) -> aiohttp.ClientResponse:
        assert self._pooled is not None and self._fresh is not None
        url = endpoint.url + path
        headers = {"Content-Type": "application/json"}
        if endpoint.api_key:
            # The engine's own key, never the client's: clients authenticate to the router.
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        try:
            return await self._pooled.post(url, data=body, headers=headers)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise _AttemptFailed(_describe(exc)) from None  # nothing listens: a fresh socket won't help
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            pass  # most likely a pooled connection the engine had closed: once more, fresh
        except aiohttp.ClientError as exc:
            raise _AttemptFailed(_describe(exc)) from None
        try:
            return await self._fresh.post(url, data=body, headers=headers)
        except aiohttp.ClientError as exc:
            raise _AttemptFailed(_describe(exc)) from None


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


async def _snippet(response: aiohttp.ClientResponse) -> str:
    try:
        text = (await response.content.read(300)).decode("utf-8", "replace").strip()
    except aiohttp.ClientError:
        text = ""
    finally:
        response.close()
    return f"({text})" if text else ""
