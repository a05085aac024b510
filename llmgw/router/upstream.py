"""Reaching an engine: the router's only HTTP client, its choice of endpoint, and its retry rules.

``Forwarder.open`` sends one request to one of a model's endpoints and returns
the engine's response as soon as its headers arrive, before any byte has gone to
the client. That is the only window in which a retry is safe, so every retry
lives here and the relay in ``app`` never retries:

* a refused or timed-out connect, no response header within the first-byte
  timeout, or an HTTP 502/503/504 (or 401: the engine refused the router's key)
  from the engine: try the model's next endpoint (a replica that is stopping or
  still loading answers 503 for a moment);
* a reset or "server disconnected" on a pooled connection: retry the same engine
  once on a fresh connection first. xllamacpp's server closes the connection
  after a streamed response while still advertising keep-alive, so the pool
  hands out connections the engine has already dropped.

The endpoint is chosen by the model's ``routing`` policy (``pick``, ``prefix``)
from the loads ``loadwatch`` keeps, skipping endpoints ``health`` has ejected.
Each forwarded request counts as in flight on its replica from the attempt until
its response is closed or released, a stream until it ends or is cancelled.

Timeouts: connect (5 s), first byte (600 s: a long prefill of a big prompt on a
busy engine must not be cut), idle between chunks (300 s); never a total one, a
long generation must never be cut. A stream's headers usually arrive before its
first token, so its body keeps the first-byte timeout until ``body_started`` is
called on it, and only then the idle one.

Foreign exceptions end here: a caller sees an open response or a 502 ``ApiError``
listing what each attempt met.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from llmgw.router import errors, health, loadwatch, metrics, pick, prefix
from llmgw.router.table import Endpoint, ModelRoute, TableHolder

log = logging.getLogger(__name__)

#: Statuses that mean "this engine cannot take it now", not "this request is bad". A 401
#: is the engine refusing the key the control plane gave the router, not the client's key
#: (which never reaches an engine): relayed, it would tell the client its own key is wrong.
RETRY_STATUSES = frozenset({401, 502, 503, 504})


class _AttemptFailed(Exception):
    pass


class _CountedResponse(aiohttp.ClientResponse):
    """A response that tells the Forwarder once when it is done: closed, released, or read to the end."""

    _llmgw_done: Callable[[], None] | None = None
    _llmgw_idle_s: float | None = None  # the idle timeout ``body_started`` switches to

    def _llmgw_finish(self) -> None:
        done, self._llmgw_done = self._llmgw_done, None
        if done is not None:
            done()

    def close(self) -> None:
        super().close()
        self._llmgw_finish()

    def release(self) -> Any:
        result = super().release()
        self._llmgw_finish()
        return result


def body_started(response: aiohttp.ClientResponse) -> None:
    """Switch ``response``'s read timeout from the first-byte one to the Forwarder's idle one.

    Call it once the first chunk of a stream arrived; calling it again is harmless.
    """
    idle_timeout_s = getattr(response, "_llmgw_idle_s", None)
    if idle_timeout_s is None:
        return
    connection = response.connection
    if connection is not None and connection.protocol is not None:
        connection.protocol.read_timeout = idle_timeout_s
        connection.protocol.start_timeout()  # rescheduled now, not on the next packet


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
    """Owns the connection pools to engines and opens one upstream response per request.

    ``picker`` is the round-robin instance for models routed ``round_robin`` (kept so an
    existing call site still works); each model's ``routing`` chooses its policy. ``holder``
    lets load scraping follow the whole table; without it, the endpoints of the routes
    requests have used are scraped.
    """

    def __init__(self, picker: pick.RoundRobin | None = None, *, connect_timeout_s: float = 5.0,
                 first_byte_timeout_s: float = 600.0, idle_timeout_s: float = 300.0, max_endpoints: int = 3,
                 holder: TableHolder | None = None, scrape_interval_s: float = 1.5,
                 outliers: health.Outliers | None = None, prefix_index: prefix.PrefixIndex | None = None,
                 imbalance_ratio: float = 1.5, imbalance_slack: float = 2.0) -> None:
        least = pick.LeastOutstanding()
        self._policies: dict[str, pick.Policy] = {
            "round_robin": picker if picker is not None else pick.RoundRobin(),
            "least_outstanding": least,
            "session_affinity": pick.SessionAffinity(),
            "prefix_cache": prefix.PrefixCache(prefix_index, imbalance_ratio=imbalance_ratio,
                                               imbalance_slack=imbalance_slack),
        }
        self._max_endpoints = max_endpoints
        self._idle_timeout_s = idle_timeout_s
        # No total timeout: a long generation may take minutes; the client's disconnect is
        # what ends a request early. sock_read bounds the wait for the response headers
        # (and a stream's first token); ``body_started`` then shortens it to the idle one.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                              sock_read=first_byte_timeout_s or None)
        self._first_byte_timeout_s = first_byte_timeout_s
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        # Replica ids whose last attempt failed: a dead endpoint is logged when it starts
        # failing and when it answers again, not on every request that skips it.
        self._failing: set[str] = set()
        self.loads = loadwatch.Loads()
        self.outliers = outliers if outliers is not None else health.Outliers()
        self._holder = holder
        self._seen: dict[str, ModelRoute] = {}  # model name -> its latest route, when no holder
        self._watch = loadwatch.LoadWatch(self.loads, self._endpoints, interval_s=scrape_interval_s)

    def _endpoints(self) -> Iterable[Endpoint]:
        routes = self._holder.current.models if self._holder is not None else tuple(self._seen.values())
        endpoints = {e.replica_id: e for route in routes for e in route.endpoints}
        self.outliers.forget(endpoints.keys())  # records of replicas gone from the table
        return endpoints.values()

    def _session(self, *, force_close: bool) -> aiohttp.ClientSession:
        # limit=0: aiohttp's default of 100 connections in all would queue the 101st
        # concurrent stream behind the others, invisibly, inside the router.
        connector = aiohttp.TCPConnector(limit=0, force_close=force_close, socket_factory=_nodelay_socket)
        # Bytes pass through as the engine sent them: no decompression, and no
        # Accept-Encoding that would invite the engine to compress a stream.
        return aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False,
                                     skip_auto_headers=("User-Agent", "Accept-Encoding"),
                                     response_class=_CountedResponse)

    async def start(self) -> None:
        if self._pooled is None:
            self._pooled = self._session(force_close=False)
            self._fresh = self._session(force_close=True)
            self._watch.start(self._pooled)

    async def close(self) -> None:
        await self._watch.stop()
        for session in (self._pooled, self._fresh):
            if session is not None:
                await session.close()
        self._pooled = self._fresh = None

    def _key(self, route: ModelRoute, body: bytes) -> pick.RequestKey:
        # The fallback when the caller passed no key: a second parse of the body, which
        # costs about as much as the hashing; the app passes the key it built from its parse.
        if route.routing not in ("prefix_cache", "session_affinity"):
            return pick.NO_KEY
        try:
            doc = json.loads(body)
        except ValueError:
            return pick.NO_KEY
        return prefix.request_key(doc) if isinstance(doc, dict) else pick.NO_KEY

    async def open(self, route: ModelRoute, path: str, body: bytes, *,
                   key: pick.RequestKey | None = None) -> tuple[Endpoint, aiohttp.ClientResponse]:
        """Send ``body`` to ``path`` on an endpoint of ``route``; the response has only its headers read.

        ``key`` is the request's affinity key (``prefix.request_key``); without one it is
        read from ``body``.
        """
        if self._pooled is None:
            # Serving beats refusing: a host app that forgot startup() still works, and says so.
            log.warning("router used before startup(); opening its connection pools now")
            await self.start()
        if self._holder is None and self._seen.get(route.name) is not route:
            self._seen[route.name] = route
        policy = self._policies.get(route.routing) or self._policies[pick.DEFAULT_ROUTING]
        if key is None:
            key = self._key(route, body)
        ids = [e.replica_id for e in route.endpoints]
        ejected = self.outliers.ejected(ids)
        tried: set[str] = set()
        attempts: list[str] = []
        while len(tried) < self._max_endpoints:
            load = self.loads.of(ids)
            endpoint = policy.pick(route.name, route.endpoints, load=load, key=key, exclude=tried | ejected)
            if endpoint is None and ejected:
                # Every endpoint left is ejected: trying one beats failing the request.
                endpoint = policy.pick(route.name, route.endpoints, load=load, key=key, exclude=tried)
            if endpoint is None:
                break
            if tried:
                metrics.count_retry(route.name, endpoint.replica_id)
            tried.add(endpoint.replica_id)
            self.loads.started(endpoint.replica_id)
            try:
                response = await self._send(endpoint, path, body)
            except BaseException as exc:
                # Cancelled too (the client left while the engine had not answered): without
                # this the replica would count one more request in flight for ever.
                self.loads.finished(endpoint.replica_id)
                if not isinstance(exc, _AttemptFailed):
                    raise
                attempts.append(f"{endpoint.replica_id} at {endpoint.url}: {exc}")
                self._failed(route, endpoint, str(exc))
            else:
                if response.status not in RETRY_STATUSES:
                    self._answered(route, endpoint, response)
                    return endpoint, response
                self.loads.finished(endpoint.replica_id)  # retried elsewhere: no longer in flight
                status = response.status
                attempts.append(f"{endpoint.replica_id} at {endpoint.url}: HTTP {status} "
                                f"{await _snippet(response)}")
                if status in health.FAILURE_STATUSES:
                    self._failed(route, endpoint, f"HTTP {status}")
            if endpoint.replica_id not in self._failing:
                self._failing.add(endpoint.replica_id)
                log.warning("model %r: %s (not logged again until it answers)", route.name, attempts[-1])
        raise errors.upstream_failed(route.served_name, attempts)

    def _answered(self, route: ModelRoute, endpoint: Endpoint, response: aiohttp.ClientResponse) -> None:
        if isinstance(response, _CountedResponse):
            replica_id = endpoint.replica_id
            response._llmgw_done = lambda: self.loads.finished(replica_id)
            response._llmgw_idle_s = self._idle_timeout_s
        else:
            self.loads.finished(endpoint.replica_id)  # cannot track its end: do not count it forever
        if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
            # A whole response's body follows its headers at once: from here on, idle.
            body_started(response)
        if response.status in health.FAILURE_STATUSES:  # a 500: relayed, and counted
            self._failed(route, endpoint, f"HTTP {response.status}")
            return
        if self.outliers.succeeded(endpoint.replica_id) or endpoint.replica_id in self._failing:
            self._failing.discard(endpoint.replica_id)
            log.info("replica %s at %s answers again", endpoint.replica_id, endpoint.url)

    def _failed(self, route: ModelRoute, endpoint: Endpoint, reason: str) -> None:
        ejection = self.outliers.failed(endpoint.replica_id, reason)
        if ejection is not None:
            log.warning("model %r: replica %s at %s ejected for %.0fs after repeated failures (last: %s)",
                        route.name, endpoint.replica_id, endpoint.url, ejection.for_s, reason)
            metrics.count_ejection(route.name, endpoint.replica_id)

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
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise _AttemptFailed(f"no response within {self._first_byte_timeout_s:g}s") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            pass  # most likely a pooled connection the engine had closed: once more, fresh
        except aiohttp.ClientError as exc:
            raise _AttemptFailed(_describe(exc)) from None
        try:
            return await self._fresh.post(url, data=body, headers=headers)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                raise _AttemptFailed(_describe(exc)) from None
            raise _AttemptFailed(f"no response within {self._first_byte_timeout_s:g}s") from None
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
