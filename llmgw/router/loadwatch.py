"""Load signals: what the router has in flight to each replica, and what each engine says it queues.

``Loads.load(replica)`` is the number policies compare:

    load = in_flight (this router, exact, now) + waiting (the engine's queue, last scrape)

In-flight counts every request this router forwarded and has not finished,
streams included until they end or are cancelled (``upstream`` counts). It is
exact and immediate, but blind to other routers and clients. The engine's
waiting queue covers those: requests past its batch size wait there, and each
one delays a new request by a whole generation. The engine's *running* count is
not added: this router's share of it is already in in-flight, and counting it
twice would push traffic away from the replicas this router uses most.
``kv_cache_usage`` is kept for the record (vLLM's), not in the formula.

``LoadWatch`` scrapes ``/metrics`` of every endpoint (with its api key) every
1.5 s as one asyncio task, never on the request path. It follows the table:
new endpoints are scraped from the next round, gone ones forgotten. A failing
scrape keeps the last value for ``stale_s``, then drops it (an engine that
stopped answering is not "idle"; its in-flight still counts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping

import aiohttp

from llmgw.core import engines
from llmgw.core.background import Background
from llmgw.router.response import ClientError
from llmgw.router.table import Endpoint

log = logging.getLogger(__name__)

# The gauges of requests queued, running and the KV cache's use are each engine's record's
# (llmgw.core.engines), read at each scrape: a scrape does not know the engine it reads, so every
# engine's names are looked for, in the registry's order (the first one present wins).


def wanted() -> frozenset[str]:
    """Every gauge name an engine's load is read from."""
    return frozenset((*engines.queue_metrics(), *engines.running_metrics(), *engines.kv_usage_metrics(),
                      *engines.token_metrics(0), *engines.token_metrics(1)))


def parse_gauges(text: str, names: Collection[str] | None = None) -> dict[str, float]:
    """The values of the named samples (every engine's load gauges when None) in a Prometheus text
    exposition, summed over label sets."""
    if names is None:
        names = wanted()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if name not in names:
                continue
            # Label values may hold spaces and braces; the value follows the last "}".
            rest = line[line.rfind("}") + 1:].split()
        else:
            name, _, tail = line.partition(" ")
            if name not in names:
                continue
            rest = tail.split()
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        values[name] = values.get(name, 0.0) + value
    return values


@dataclasses.dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one scrape of an engine said."""

    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float | None = None  # 0..1, vLLM only
    at: float = 0.0  # monotonic time of the scrape
    #: The engine's own counters of prompt and generated tokens (None: it has none), for ``enginemetrics``.
    prompt_tokens: float | None = None
    generation_tokens: float | None = None


def engine_load(gauges: Mapping[str, float], *, at: float = 0.0) -> EngineLoad:
    def first(names: tuple[str, ...]) -> float | None:
        return next((gauges[n] for n in names if n in gauges), None)
    return EngineLoad(waiting=first(engines.queue_metrics()) or 0.0, running=first(engines.running_metrics()) or 0.0,
                      kv_cache_usage=first(engines.kv_usage_metrics()), at=at,
                      prompt_tokens=first(engines.token_metrics(0)), generation_tokens=first(engines.token_metrics(1)))


class Loads:
    """In-flight counts and the last engine scrapes, per replica id."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.engine: dict[str, EngineLoad] = {}

    def started(self, replica_id: str) -> None:
        self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1

    def finished(self, replica_id: str) -> None:
        n = self.in_flight.get(replica_id, 0) - 1
        if n > 0:
            self.in_flight[replica_id] = n
        else:
            self.in_flight.pop(replica_id, None)

    def load(self, replica_id: str) -> float:
        engine = self.engine.get(replica_id)
        return self.in_flight.get(replica_id, 0) + (engine.waiting if engine is not None else 0.0)

    def of(self, replica_ids: Iterable[str]) -> dict[str, float]:
        return {r: self.load(r) for r in replica_ids}


class LoadWatch:
    """Scrapes every endpoint's ``/metrics`` each ``interval_s`` into ``loads.engine``."""

    def __init__(self, loads: Loads, endpoints: Callable[[], Iterable[Endpoint]], *,
                 interval_s: float = 1.5, timeout_s: float = 1.0, stale_s: float = 6.0,
                 clock: Callable[[], float] = time.monotonic,
                 verified: Callable[[Endpoint], Awaitable[tuple[int, bytes]] | None] | None = None) -> None:
        """``verified``: an engine serving TLS the router verifies (``enginetls``) is scraped through it
        (status and body), so its bearer key goes only to the engine the table names; None for the others."""
        self._loads = loads
        self._endpoints = endpoints
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._stale_s = stale_s
        self._clock = clock
        self._verified = verified
        self._task = Background("llmgw-router-loadwatch")
        self._failing: set[str] = set()  # logged once when a scrape starts failing

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task.start(lambda: self._run(session))

    async def stop(self) -> None:
        await self._task.stop()

    async def _run(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.scrape_once(session)
            except Exception:  # a bug here must not end load tracking for the router's life
                log.exception("load scrape round failed")
            await asyncio.sleep(self._interval_s)

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        """One round: scrape every current endpoint at once, forget the ones gone from the table."""
        current = {e.replica_id: e for e in self._endpoints()}
        for gone in [r for r in self._loads.engine if r not in current]:
            del self._loads.engine[gone]
        self._failing &= current.keys()
        await asyncio.gather(*(self._scrape(session, e) for e in current.values()))

    async def _scrape(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        through = self._verified(endpoint) if self._verified is not None else None
        try:
            if through is not None:
                async with asyncio.timeout(self._timeout.total):
                    status, body = await through
                if status != 200:
                    raise aiohttp.ClientError(f"HTTP {status}")
                text = body.decode("utf-8", "replace")
            else:
                async with session.get(endpoint.url + "/metrics", headers=headers,
                                       timeout=self._timeout) as response:
                    if response.status != 200:
                        raise aiohttp.ClientError(f"HTTP {response.status}")
                    text = await response.text(errors="replace")
        except (TimeoutError, aiohttp.ClientError, ClientError) as exc:
            if endpoint.replica_id not in self._failing:
                self._failing.add(endpoint.replica_id)
                log.info("load scrape of %s at %s failing: %s", endpoint.replica_id, endpoint.url,
                         str(exc) or type(exc).__name__)
            last = self._loads.engine.get(endpoint.replica_id)
            if last is not None and self._clock() - last.at > self._stale_s:
                del self._loads.engine[endpoint.replica_id]
            return
        self._failing.discard(endpoint.replica_id)
        self._loads.engine[endpoint.replica_id] = engine_load(parse_gauges(text), at=self._clock())
