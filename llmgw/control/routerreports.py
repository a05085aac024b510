"""What routers report: ejections and recoveries of replicas, shown on the replica and counted; keys used.

A router takes a replica out of rotation when real requests to it keep failing
(``llmgw.router.health``), often before the control plane's own health check
notices. Routers report it here: over HTTP (``POST /api/v1/router/events``) from
a standalone router, or through a callback inside ``llmgw server``: the same
``RouterReport`` (``llmgw.api.reports`` describes it), as JSON or as the object.

Kept in memory only: an ejection lasts seconds to a minute, and after a restart
of the control plane a stale one would be wrong rather than useful. An ejection
is shown until its router reports the replica answering again, or until its
backoff has passed (the router then tries it again; one more failure is a new
report), whichever comes first. Several routers may eject the same replica; each
is shown.

A ``key_used`` event (``KeyUsed``: the newest time a router let a key in) is handed to
``on_key_used(key_id, at)``, which the server wires to ``control.keyuse`` (the key's ``last_used_at``
in the store); without one it is accepted and dropped.

Counted in ``/metrics`` as ``llmgw_router_reported_ejections_total{router, model}``
(a different name from the router's own ``llmgw_router_ejections_total``, which the
in-process router serves on the same ``/metrics``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import prometheus_client

from llmgw.api.reports import MAX_EVENTS_PER_BATCH
from llmgw.api.routing import BadReport, Ejected, KeyUsed, RouterReport

__all__ = ["MAX_EVENTS_PER_BATCH", "BadReport", "Ejection", "RouterEvents"]


@dataclasses.dataclass(frozen=True, slots=True)
class Ejection:
    router: str
    model: str
    replica: str
    reason: str
    failures: int
    for_s: float
    at: float  # wall clock of the ejection, as the router said
    until: float  # wall clock, this control plane's: received + for_s

    def message(self) -> str:
        what = f"{self.failures} consecutive failures" if self.failures > 1 else "a failure on probation"
        return f"ejected by router {self.router} for {self.for_s:g}s: {what} (last: {self.reason})"


class RouterEvents:
    """The current ejections per replica, from every router's reports."""

    def __init__(self, *, clock: Callable[[], float] = time.time,
                 registry: prometheus_client.CollectorRegistry | None = None,
                 on_key_used: Callable[[str, float], None] | None = None) -> None:
        self._clock = clock
        #: Where ``key_used`` events go (``keyuse.Writer.note``); settable after construction, as the
        #: server makes this before the cluster its writer asks whether it leads.
        self.on_key_used = on_key_used
        self._by_replica: dict[str, dict[str, Ejection]] = {}  # replica -> router -> its ejection
        self.registry = registry or prometheus_client.CollectorRegistry()
        self._ejections = prometheus_client.Counter(
            "llmgw_router_reported_ejections_total", "Replica ejections reported by routers",
            ["router", "model"], registry=self.registry)
        self._recoveries = prometheus_client.Counter(
            "llmgw_router_reported_recoveries_total", "Ejected replicas reported answering again by routers",
            ["router", "model"], registry=self.registry)

    def record(self, doc: RouterReport | Mapping[str, Any]) -> int:
        """Apply one report (a ``RouterReport``, or a posted body: ``BadReport`` names a bad field and
        nothing applies); the number of events applied."""
        return self.apply(RouterReport.from_doc(doc))

    def apply(self, report: RouterReport) -> int:
        """Apply one report already read; the number of events applied."""
        now = self._clock()
        router = report.router
        for event in report.events:
            at = float(event.at or now)
            if isinstance(event, KeyUsed):
                if self.on_key_used is not None:
                    self.on_key_used(event.key, at)
            elif isinstance(event, Ejected):
                for_s = float(event.for_s or 0.0)
                self._by_replica.setdefault(event.replica, {})[router] = Ejection(
                    router=router, model=event.model, replica=event.replica, reason=event.reason[:300],
                    failures=int(event.failures or 1), for_s=for_s, at=at, until=now + for_s)
                self._ejections.labels(router=router, model=event.model).inc()
            else:
                mine = self._by_replica.get(event.replica)
                if mine is not None:
                    mine.pop(router, None)
                    if not mine:
                        del self._by_replica[event.replica]
                self._recoveries.labels(router=router, model=event.model).inc()
        return len(report.events)

    def ejections(self, replica_id: str) -> list[Ejection]:
        """The ejections of ``replica_id`` in force now, oldest first."""
        mine = self._by_replica.get(replica_id)
        if not mine:
            return []
        now = self._clock()
        for router in [r for r, e in mine.items() if e.until <= now]:
            del mine[router]
        if not mine:
            del self._by_replica[replica_id]
            return []
        return sorted(mine.values(), key=lambda e: e.at)

    def current(self) -> dict[str, str]:
        """Every replica some router has ejected now, with the sentence ``message`` gives.

        The reconciler weighs these (``llmgw.control.reconcile.liveness``): an ejection
        shortens the grace of a replica its agent also calls Unhealthy, and moves nothing alone.
        """
        return {replica: said for replica in list(self._by_replica) if (said := self.message(replica))}

    def message(self, replica_id: str) -> str:
        """One sentence for the replica's message column, or "" when no router has it ejected."""
        return "; ".join(e.message() for e in self.ejections(replica_id))

