"""The usage and quota service routers reach: ``ingest`` stores a usage batch, ``sync`` answers a quota sync.

Both are the transports of ``api.usage`` as coroutines (``QuotaTransport``/``UsageTransport``): the
in-process router awaits them directly, a standalone router through ``control.http.routerusage``. Every
store call runs on the store's thread (``StoreThread``), never on the event loop.

A budget's limit is the control plane's to know, never the router's word: ``limits_of`` reads the key's
and the project's limits from a cache of the store refreshed at most every ``LIMITS_TTL_S`` (and at once
after ``invalidate``, which ``follow`` calls when the routers' table, which carries keys' and projects'
limits, changes), so a sync costs one
transaction and not three.

What each control plane stored is also counted for Prometheus per project and model
(``llmgw_usage_*_total``); past ``MAX_SERIES`` pairs, the rest is counted under ``other`` so a cluster
with many projects cannot grow the scrape without bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import prometheus_client

from llmgw.api.reports import BadReport
from llmgw.api.routing import EndpointsDoc
from llmgw.api.usage import QuotaAnswer, QuotaSync, UsageAck, UsageBatch, UsageRecord
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.quotas import Synced
from llmgw.control.usage.config import UsageConfig
from llmgw.control.usage.thresholds import Thresholds
from llmgw.control.usage.webhook import Webhook
from llmgw.core import quota

log = logging.getLogger(__name__)

LIMITS_TTL_S = 1.0
#: (project, model) pairs counted by name; more are counted as ("other", "other").
MAX_SERIES = 500


class UsageService:
    def __init__(self, db: StoreThread, cfg: UsageConfig = UsageConfig(), *,
                 registry: prometheus_client.CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.cfg = cfg
        self.clock = clock
        self.registry = registry or prometheus_client.CollectorRegistry()
        webhook = Webhook(cfg.webhook_url, cfg.webhook_secret) if cfg.webhook_url else None
        self.thresholds = Thresholds(self.registry, webhook)
        self._limits: tuple[dict[str, quota.Limits], dict[str, quota.Limits]] = ({}, {})
        self._limits_at = -LIMITS_TTL_S
        self._series: set[tuple[str, str]] = set()
        labels = ["project", "model"]
        self._requests = prometheus_client.Counter("llmgw_usage_requests", "Requests stored, by project and model",
                                                   labels, registry=self.registry)
        self._errors = prometheus_client.Counter("llmgw_usage_errors", "Requests stored that were answered an "
                                                 "error (status 400 or more, 499: the client left)", labels,
                                                 registry=self.registry)
        self._tokens = prometheus_client.Counter("llmgw_usage_tokens", "Tokens stored, by project, model and type "
                                                 "(prompt, cached, completion)", [*labels, "type"],
                                                 registry=self.registry)
        self._spend = prometheus_client.Counter("llmgw_usage_spend_micros", "Spend stored, in millionths of the "
                                                "currency unit", labels, registry=self.registry)
        #: Each budget in force, as the last sync of it answered (alerts fire at 0.9; ``thresholds`` tells 80/100 %).
        self._used = prometheus_client.Gauge("llmgw_budget_used_ratio", "A budget's use in its current period, "
                                             "charged over limit, by scope (key:ID or project:NAME) and kind",
                                             ["scope", "kind"], registry=self.registry)
        self._in_force: set[tuple[str, str]] = set()

    # -- the transports -------------------------------------------------------------------------------
    async def ingest(self, batch: UsageBatch) -> UsageAck:
        """Stores the batch's records above its journal's mark; the ack's mark is what the router may forget."""
        mark, fresh = await self.db.call(self.db.store.apply_usage_records, batch, now=self.clock(),
                                         request_log=self.cfg.request_log)
        self._count(fresh)
        return UsageAck(batch.journal, mark)

    async def sync(self, s: QuotaSync) -> QuotaAnswer:
        """Applies a router's consumed and returned units and grants out of what is free; BadReport naming an
        item whose budget is not one (nothing applied)."""
        for i, item in enumerate(s.items):
            try:
                quota.parse_budget(item.budget)
            except quota.BadLimits as e:
                raise BadReport(f"items[{i}].budget: {e}") from None
        synced: Synced = await self.db.call(self._sync_on_thread, s, self.clock())
        self.thresholds.announce(synced.crossings)
        for grant in synced.grants:
            scope, kind, _ = quota.parse_budget(grant.budget)
            if grant.limit > 0:
                self._used.labels(scope, kind).set(grant.charged / grant.limit)
                self._in_force.add((scope, kind))
            elif (scope, kind) in self._in_force:  # no longer in force: its series goes
                self._in_force.discard((scope, kind))
                self._used.remove(scope, kind)
        return QuotaAnswer(synced.grants)

    def invalidate(self) -> None:
        """Keys or projects changed: the next sync reads their limits afresh."""
        self._limits_at = -LIMITS_TTL_S

    async def follow(self, wait_table: Callable[..., Awaitable[EndpointsDoc]]) -> None:
        """Invalidates the limits whenever the routers' table changes (a key's or a project's limits are in it),
        until cancelled; ``wait_table`` is ``Cluster.wait_table``."""
        version: int | None = None
        while True:
            doc = await wait_table(after=version, timeout=25.0)
            if doc.version != version:
                version = doc.version
                self.invalidate()

    async def close(self) -> None:
        if self.thresholds.webhook is not None:
            await self.thresholds.webhook.close()

    # -- on the store's thread ----------------------------------------------------------------------
    def _sync_on_thread(self, s: QuotaSync, now: float) -> Synced:
        if time.monotonic() - self._limits_at >= LIMITS_TTL_S:
            self._limits = self.db.store.quota_limits()
            self._limits_at = time.monotonic()
        return self.db.store.quota_sync(s.router_id, s.items, self.limits_of, now=now)

    def limits_of(self, scope: str, kind: str) -> int:
        """A budget's limit in its units as the store said at the last refresh; 0: not in force."""
        keys, projects = self._limits
        kind_of, _, name = scope.partition(":")
        limits = (keys if kind_of == "key" else projects).get(name)
        return limits.units(kind) if limits is not None else 0

    # -- metrics --------------------------------------------------------------------------------------
    def _count(self, records: list[UsageRecord]) -> None:
        for r in records:
            pair = (r.project, r.model)
            if pair not in self._series:
                if len(self._series) >= MAX_SERIES:
                    pair = ("other", "other")
                else:
                    self._series.add(pair)
            project, model = pair
            self._requests.labels(project, model).inc()
            if r.status >= 400:
                self._errors.labels(project, model).inc()
            for kind, n in (("prompt", r.prompt_tokens), ("cached", r.cached_tokens),
                            ("completion", r.completion_tokens)):
                if n:
                    self._tokens.labels(project, model, kind).inc(n)
            if r.spend_micros:
                self._spend.labels(project, model).inc(r.spend_micros)
