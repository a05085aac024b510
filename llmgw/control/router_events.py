"""What routers report: ejections and recoveries of replicas, shown on the replica and counted; keys used.

A router takes a replica out of rotation when real requests to it keep failing
(``llmgw.router.health``), often before the control plane's own health check
notices. Routers report it here: over HTTP (``POST /api/v1/router/events``) from
a standalone router, or through a callback inside ``llmgw server``; the body
shape is the same (``llmgw.router.events`` describes it).

Kept in memory only: an ejection lasts seconds to a minute, and after a restart
of the control plane a stale one would be wrong rather than useful. An ejection
is shown until its router reports the replica answering again, or until its
backoff has passed (the router then tries it again; one more failure is a new
report), whichever comes first. Several routers may eject the same replica; each
is shown.

A ``key_used`` event (the newest time a router let a key in) is handed to ``on_key_used(key_id, at)``,
which the server wires to ``control.keyuse`` (the key's ``last_used_at`` in the store); without one it
is accepted and dropped.

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

MAX_EVENTS_PER_BATCH = 1000


class BadReport(ValueError):
    """A report that is not what routers send; the message names the field."""


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

    def record(self, doc: Mapping[str, Any]) -> int:
        """Apply one report (``{"router": id, "events": [...]}``); the number of events applied."""
        if not isinstance(doc, Mapping):
            raise BadReport("body: expected an object with router and events")
        router = doc.get("router")
        if not isinstance(router, str) or not router:
            raise BadReport("router: expected the reporting router's id, a non-empty string")
        events = doc.get("events")
        if not isinstance(events, list):
            raise BadReport("events: expected a list")
        if len(events) > MAX_EVENTS_PER_BATCH:
            raise BadReport(f"events: at most {MAX_EVENTS_PER_BATCH} per report, got {len(events)}")
        parsed = [_event(f"events[{i}]", e) for i, e in enumerate(events)]  # all checked before any applies
        now = self._clock()
        for kind, model, replica, raw in parsed:
            if kind == "key_used":
                if self.on_key_used is not None:
                    self.on_key_used(raw["key"], float(raw.get("at") or now))
            elif kind == "ejected":
                for_s = float(raw.get("for_s") or 0.0)
                self._by_replica.setdefault(replica, {})[router] = Ejection(
                    router=router, model=model, replica=replica, reason=str(raw.get("reason") or "")[:300],
                    failures=int(raw.get("failures") or 1), for_s=for_s, at=float(raw.get("at") or now),
                    until=now + for_s)
                self._ejections.labels(router=router, model=model).inc()
            else:
                mine = self._by_replica.get(replica)
                if mine is not None:
                    mine.pop(router, None)
                    if not mine:
                        del self._by_replica[replica]
                self._recoveries.labels(router=router, model=model).inc()
        return len(parsed)

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


def _event(where: str, raw: Any) -> tuple[str, str, str, Mapping[str, Any]]:
    if not isinstance(raw, Mapping):
        raise BadReport(f"{where}: expected an object")
    kind = raw.get("type")
    if kind not in ("ejected", "recovered", "key_used"):
        raise BadReport(f"{where}.type: expected 'ejected', 'recovered' or 'key_used', got {kind!r}")
    for key in ("key",) if kind == "key_used" else ("model", "replica"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise BadReport(f"{where}.{key}: expected a non-empty string")
    for key in ("for_s", "at"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise BadReport(f"{where}.{key}: expected a number >= 0, got {value!r}")
    failures = raw.get("failures")
    if failures is not None and (isinstance(failures, bool) or not isinstance(failures, int) or failures < 0):
        raise BadReport(f"{where}.failures: expected a whole number, got {failures!r}")
    return kind, raw.get("model", ""), raw.get("replica", ""), raw
