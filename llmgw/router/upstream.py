"""Reaching an engine: the router's only HTTP client, its choice of endpoint, and its retry rules.

``Forwarder.open`` sends one request to one of a model's endpoints and returns
the engine's response as soon as its headers arrive, before any byte has gone to
the client. That is the only window in which a retry is safe, so every retry
lives here and the relay (``proxying``, ``relay``) never retries:

* a refused or timed-out connect, no response header within the first-byte
  timeout, or an HTTP 502/503/504 (or 401: the engine refused the router's key)
  from the engine: try the model's next endpoint (a replica that is stopping or
  still loading answers 503 for a moment);
* a reset or "server disconnected" on a pooled connection: retry the same engine
  once on a fresh connection first. xllamacpp's server closes the connection
  after a streamed response while still advertising keep-alive, so the pool
  hands out connections the engine has already dropped;
* an engine that fails TLS verification (``enginetls``): ejected at once, and the attempt is not
  counted against ``max_endpoints`` (nothing was sent; the handshake took milliseconds).

The endpoint is chosen by the model's ``routing`` policy (``policies``: one instance
of each, with hooks on a request's life) from the loads ``loadwatch`` keeps,
skipping endpoints ``health`` has ejected and those at the model's per-replica
concurrency limit (``pick.at_limit``; admission keeps the model's total within
what its endpoints take, so one is free). Each
ejection and recovery goes to ``events`` when a sink is given; with tracing on,
each attempt carries a ``traceparent`` (``tracing``).
Each forwarded request counts as in flight on its replica from the attempt until
its response is closed or released, a stream until it ends or is cancelled.

Timeouts: connect (5 s), first byte (600 s: a long prefill of a big prompt on a
busy engine must not be cut), idle between chunks (300 s); never a total one, a
long generation must never be cut. A stream's headers usually arrive before its
first token, so its body keeps the first-byte timeout until ``body_started`` is
called on it, and only then the idle one.

A policy is told of each attempt (``routed``), may make it wait before it is sent
(``prefix_cache``: for a prefix in its prefill on that replica, at most
``prefill_wait_s``) and is told when its first token came back or it ended (``done``,
through the response's ``on_first_byte`` hook).

For llama.cpp streams the router asks for prefill progress (``request.with_progress``)
and reads and drops those events before returning the response (``lookahead``): so an
engine failing during a prefill is still retried elsewhere, and a client that
leaves stops the prefill within about two batches (the closed connection fails
the engine's next progress write).

Foreign exceptions end here: a caller sees an open response or a 502 ``ApiError``
listing what each attempt met.

Requests go through ``client`` (keep-alive pools on asyncio.Protocol and httptools:
aiohttp's client was the largest cost per request in the router's profile);
aiohttp remains only for the load scraper's ``/metrics`` polls, off the hot path.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
from collections.abc import Awaitable, Iterable, Iterator

import aiohttp

from llmgw.router import (
    adaptercache,
    admission,
    client,
    enginemetrics,
    enginetls,
    errors,
    health,
    hung,
    loadwatch,
    metrics,
    pick,
    policies,
    prefix,
)
from llmgw.router import reports as router_events
from llmgw.router import tracing as router_tracing
from llmgw.router.lookahead import AttemptFailed, describe, input_too_large, past_progress, snippet
from llmgw.router.table import Endpoint, ModelRoute, RouteTable, TableHolder

log = logging.getLogger(__name__)

#: Statuses that mean "this engine cannot take it now", not "this request is bad". A 401
#: is the engine refusing the key the control plane gave the router, not the client's key
#: (which never reaches an engine): relayed, it would tell the client its own key is wrong.
RETRY_STATUSES = frozenset({401, 502, 503, 504})
#: What a first attempt with nothing ejected, hung or full excludes (never mutated).
_NOTHING: frozenset[str] = frozenset()
def _nodelay_socket(addr_info: tuple) -> socket.socket:  # type: ignore[type-arg]
    # Without TCP_NODELAY, Nagle holds a small write until the peer's delayed ACK (40 ms).
    # Only the load scraper's aiohttp session uses this; ``client`` sets it on its own.
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Forwarder:
    """Owns the connection pools to engines and opens one upstream response per request.

    Each model's ``routing`` chooses its policy among ``policies``. ``holder`` lets load
    scraping follow the whole table; without it, the endpoints of the routes requests have
    used are scraped.
    """

    def __init__(self, *, connect_timeout_s: float = 5.0,
                 first_byte_timeout_s: float = 600.0, idle_timeout_s: float = 300.0, max_endpoints: int = 3,
                 holder: TableHolder | None = None, scrape_interval_s: float = 1.5,
                 outliers: health.Outliers | None = None, prefix_index: prefix.PrefixIndex | None = None,
                 events: router_events.Sink | None = None, prefill_wait_s: float = 30.0) -> None:
        #: One instance of each routing policy, by name (``policies.REGISTRY``).
        self.policies = policies.create(policies.Options(prefix_index=prefix_index, prefill_wait_s=prefill_wait_s))
        self._default_policy = self.policies[policies.DEFAULT]
        self._max_endpoints = max_endpoints
        self._idle_timeout_s = idle_timeout_s
        # No total timeout: a long generation may take minutes; the client's disconnect is
        # what ends a request early. The read timeout bounds the wait for the response
        # headers (and a stream's first token); ``body_started`` then shortens it to the idle one.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                              sock_read=first_byte_timeout_s or None)
        self._first_byte_timeout_s = first_byte_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._pool: client.Pool | None = None
        self._pooled: aiohttp.ClientSession | None = None  # the load scraper's session only
        # Header lines per endpoint, built once: (url, api_key) -> bytes.
        self._heads: dict[tuple[str, str], bytes] = {}
        # Replica ids whose last attempt failed: a dead endpoint is logged when it starts
        # failing and when it answers again, not on every request that skips it.
        self._failing: set[str] = set()
        self.loads = loadwatch.Loads()
        self.outliers = outliers if outliers is not None else health.Outliers()
        self.events = events  # told of each ejection and recovery, for the control plane
        # Attempts waiting on a first byte, given up when their replica is found hung (``hung``).
        self.waits = hung.Waits()
        #: Each replica's LoRA cache as this router models it: an adapter's requests go where it is held.
        self.adapters = adaptercache.AdapterCaches()
        if holder is not None:
            holder.listen(self.waits.follow)
            holder.listen(self.adapters.follow)
        self._holder = holder
        self._seen: dict[str, ModelRoute] = {}  # model name -> its latest route, when no holder
        self._watch = loadwatch.LoadWatch(self.loads, self._endpoints, interval_s=scrape_interval_s,
                                          verified=self._scrape_verified)
        enginemetrics.COLLECTOR.source = self._engine_rows  # the process's one forwarder: its scrapes exported
        #: The ``https://`` engines to verify (``enginetls``), by URL, from each table's ``engine_ca``.
        self._expected: dict[str, enginetls.Expected] = {}
        if holder is not None:
            holder.listen(self._follow_tls)
            self._follow_tls(holder.current)

    def _follow_tls(self, table: RouteTable) -> None:
        self._expected = enginetls.expectations(table.engine_ca, (e for m in table.models for e in m.endpoints),
                                                self._expected)
        if self._pool is not None:
            self._pool.expect(self._expected)

    def _scrape_verified(self, endpoint: Endpoint) -> Awaitable[tuple[int, bytes]] | None:
        """A verified engine's ``/metrics`` through the pool (its certificate checked before the key is sent);
        None for the others (the scraper's own session)."""
        if endpoint.url not in self._expected or self._pool is None:
            return None
        return self._pool.get(endpoint.url, "/metrics", self._head(endpoint))

    def _engine_rows(self) -> Iterator[tuple[str, str, loadwatch.EngineLoad]]:
        """(model, replica, its engine's last scrape) for every endpoint of the table with a fresh scrape."""
        routes = self._holder.current.models if self._holder is not None else tuple(self._seen.values())
        for route in routes:
            for e in route.endpoints:
                load = self.loads.engine.get(e.replica_id)
                if load is not None:
                    yield route.name, e.replica_id, load

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
                                     skip_auto_headers=("User-Agent", "Accept-Encoding"))

    async def start(self) -> None:
        if self._pool is None:
            self._pool = client.Pool(connect_timeout_s=self._connect_timeout_s,
                                     read_timeout_s=self._first_byte_timeout_s)
            self._pool.expect(self._expected)
            self._pooled = self._session(force_close=False)
            self._watch.start(self._pooled)

    async def close(self) -> None:
        await self._watch.stop()
        if self._pooled is not None:
            await self._pooled.close()
        if self._pool is not None:
            self._pool.close()
        self._pooled = self._pool = None

    def _key(self, policy: policies.Policy, body: bytes) -> pick.RequestKey:
        # The fallback when the caller passed no key: a second parse of the body, which
        # costs about as much as the hashing; the app passes the key it built from its parse.
        if not policy.keyed:
            return pick.NO_KEY
        try:
            doc = json.loads(body)
        except ValueError:
            return pick.NO_KEY
        return prefix.request_key(doc, tokens=policy.reads_tokens) if isinstance(doc, dict) else pick.NO_KEY

    async def open(self, route: ModelRoute, path: str, body: bytes, *,
                   key: pick.RequestKey | None = None, stream: bool = False,
                   progress: bool = False) -> tuple[Endpoint, client.Response]:
        """Send ``body`` to ``path`` on an endpoint of ``route``; the response has only its headers read.

        ``key`` is the request's affinity key (``prefix.request_key``); without one it is
        read from ``body``. ``stream``: the request asked for SSE, so its first chunk
        says when its prefill ended (only such requests lead a prefix others wait for).
        ``progress``: the router asked the engine for prefill progress events
        (``request.with_progress``); they are read and dropped here, so the response
        returned starts where it would have without them.
        """
        if self._pool is None:
            # Serving beats refusing: a host app that forgot startup() still works, and says so.
            log.warning("router used before startup(); opening its connection pools now")
            await self.start()
        if self._holder is None and self._seen.get(route.name) is not route:
            self._seen[route.name] = route
        policy = self.policies.get(route.routing) or self._default_policy
        if key is None:
            key = self._key(policy, body)
        ids = [e.replica_id for e in route.endpoints]
        ejected = self.outliers.ejected(ids) | self.waits.among(ids)
        tried: set[str] = set()
        attempts: list[str] = []
        refused = 0  # engines that failed TLS verification: refused before a byte was sent, not counted
        while len(tried) - refused < self._max_endpoints:
            endpoint, lacking = self._pick(policy, route, ids, key, tried, ejected, retried=bool(attempts))
            if endpoint is None:
                break
            if tried:
                metrics.count_retry(route.name, endpoint.replica_id)
            tried.add(endpoint.replica_id)
            ticket = policy.routed(route.name, route.engine, endpoint.replica_id, lacking, key, stream=stream)
            if ticket is not None and ticket.waits:
                try:
                    await policy.wait(ticket)
                except BaseException:  # the client left while waiting: its prefill will never be queued
                    policy.done(ticket)
                    raise
            self.loads.started(endpoint.replica_id)
            try:
                with self.waits.waiting(endpoint.replica_id):
                    response = await self._send(endpoint, path, body)
                    if progress and response.status == 200:
                        await past_progress(response)
            except BaseException as exc:
                if ticket is not None:
                    policy.done(ticket)
                # Cancelled too (the client left while the engine had not answered): without
                # this the replica would count one more request in flight for ever.
                self.loads.finished(endpoint.replica_id)
                if not isinstance(exc, AttemptFailed | hung.Abandoned):
                    raise
                attempts.append(f"{endpoint.replica_id} at {endpoint.url}: {exc}")
                if isinstance(exc, AttemptFailed):  # an abandoned one is out already: no ejection
                    self._failed(route, endpoint, str(exc), at_once=exc.at_once)
                    refused += exc.at_once
            else:
                if response.status not in RETRY_STATUSES:
                    if ticket is not None:
                        response.on_first_byte = functools.partial(policy.done, ticket)
                    self._answered(route, endpoint, response)
                    return endpoint, response
                if ticket is not None:
                    policy.done(ticket)
                self.loads.finished(endpoint.replica_id)  # retried elsewhere: no longer in flight
                status = response.status
                attempts.append(f"{endpoint.replica_id} at {endpoint.url}: HTTP {status} "
                                f"{await snippet(response)}")
                if status in health.FAILURE_STATUSES:
                    self._failed(route, endpoint, f"HTTP {status}")
            if endpoint.replica_id not in self._failing:
                self._failing.add(endpoint.replica_id)
                log.warning("model %r: %s (not logged again until it answers)", route.name, attempts[-1])
        raise errors.upstream_failed(route.served_name, attempts)

    def _pick(self, policy: policies.Policy, route: ModelRoute, ids: list[str], key: pick.RequestKey,
              tried: set[str], ejected: set[str], *, retried: bool) -> tuple[Endpoint | None, int]:
        """The policy's endpoint for the next attempt and the prompt blocks it lacks; None: none left to try.

        Raises ``Overloaded`` when every replica is at its concurrency limit before any attempt.
        """
        load = self.loads.of(ids) if policy.uses_load else policies.NO_LOAD
        # Replicas at their concurrency limit are never picked, ejected or not.
        full = pick.at_limit(ids, self.loads.in_flight, route.replica_limit)
        # The usual first attempt excludes nothing: no set is built for it.
        exclude = tried | ejected | full if tried or ejected or full else _NOTHING
        if route.parent:  # a LoRA adapter's request: to a replica whose engine holds it (``adaptercache``)
            exclude = self.adapters.exclude(route, ids, self.loads.in_flight, exclude)
        endpoint, lacking = policy.pick(route.name, route.endpoints, load=load, key=key, exclude=exclude)
        if endpoint is None and ejected:
            # Every endpoint left is ejected: trying one beats failing the request.
            endpoint, lacking = policy.pick(route.name, route.endpoints, load=load, key=key, exclude=tried | full)
        if endpoint is None and full and not retried:  # admission caps the model, so only a race gets here
            raise admission.Overloaded(
                f"Every replica of {route.name!r} is at its limit of {route.replica_limit} requests at "
                "once; retry in 1s.", retry_after_s=1)
        if route.parent and endpoint is not None:
            self.adapters.used(route, endpoint.replica_id)
        return endpoint, lacking

    def _answered(self, route: ModelRoute, endpoint: Endpoint, response: client.Response) -> None:
        replica_id = endpoint.replica_id
        response.on_done = lambda: self.loads.finished(replica_id)
        response.idle_timeout_s = self._idle_timeout_s
        if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
            # A whole response's body follows its headers at once: from here on, idle.
            response.body_started()
        if response.status in health.FAILURE_STATUSES:  # a 500: relayed, and counted
            if not input_too_large(route, response):
                self._failed(route, endpoint, f"HTTP {response.status}")
                return
            response.status = 400
        if self.outliers.succeeded(endpoint.replica_id) or endpoint.replica_id in self._failing:
            self._failing.discard(endpoint.replica_id)
            log.info("replica %s at %s answers again", endpoint.replica_id, endpoint.url)
            if self.events is not None:
                self.events.recovered(route.name, endpoint.replica_id)

    def _failed(self, route: ModelRoute, endpoint: Endpoint, reason: str, *, at_once: bool = False) -> None:
        ejection = self.outliers.failed(endpoint.replica_id, reason, at_once=at_once)
        if ejection is not None:
            log.warning("model %r: replica %s at %s ejected for %.0fs after %s (last: %s)", route.name,
                        endpoint.replica_id, endpoint.url, ejection.for_s,
                        "repeated failures" if ejection.failures > 1 else "a failure", reason)
            metrics.count_ejection(route.name, endpoint.replica_id)
            if self.events is not None:
                self.events.ejected(route.name, endpoint.replica_id, for_s=ejection.for_s,
                                    failures=ejection.failures, reason=reason)
            # What waits there for a first byte would most likely fail the same way, slowly.
            self.waits.abandon(endpoint.replica_id, f"ejected by this router ({reason})")

    async def _send(self, endpoint: Endpoint, path: str, body: bytes) -> client.Response:
        assert self._pool is not None
        head = self._heads.get((endpoint.url, endpoint.api_key)) or self._head(endpoint)
        spans = router_tracing.CURRENT.get()
        if spans is not None:  # tracing on: the engine continues the trace under this attempt's span
            head += b"traceparent: " + spans.upstream(endpoint.replica_id, endpoint.url).encode() + b"\r\n"
        try:
            return await self._pool.request(endpoint.url, path, head, body)
        except client.Disconnected:
            pass  # most likely a pooled connection the engine had closed: once more, fresh
        except client.TlsRefused as exc:  # not the engine the table names (``enginetls``): out at once
            raise AttemptFailed(str(exc), at_once=True) from None
        except client.ClientError as exc:  # nothing listens, or no answer in time: a fresh socket won't help
            raise AttemptFailed(describe(exc)) from None
        try:
            return await self._pool.request(endpoint.url, path, head, body, fresh=True)
        except client.TlsRefused as exc:
            raise AttemptFailed(str(exc), at_once=True) from None
        except client.ClientError as exc:
            raise AttemptFailed(describe(exc)) from None

    def _head(self, endpoint: Endpoint) -> bytes:
        """The header lines of every request to ``endpoint``, built once."""
        head = self._heads.get((endpoint.url, endpoint.api_key))
        if head is None:
            head = b"Content-Type: application/json\r\n"
            if endpoint.api_key:
                # The engine's own key, never the client's: clients authenticate to the router.
                head += b"Authorization: Bearer " + endpoint.api_key.encode("latin-1") + b"\r\n"
            if len(self._heads) > 4096:  # endpoints come and go; the cache must not grow for ever
                self._heads.clear()
            self._heads[(endpoint.url, endpoint.api_key)] = head
        return head
