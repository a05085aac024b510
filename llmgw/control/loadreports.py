"""What routers report about each model's load, merged per model for the autoscaler (issue 17).

Every router sends, every couple of seconds and at once when it holds a request
for a model at zero, one ``LoadReport`` (``llmgw.router.signals`` builds it;
``llmgw.api.reports`` says its shape and checks a posted one): counts
since its last report (arrivals, first-token times, output tokens) and gauges
as they stand (waiting, in flight, held, in flight per replica). Here those are
checked, kept per router over a sliding window, and merged into the one
``core.autoscale.Signals`` per model that ``core.autoscale.decide`` reads.

Kept in memory only, like ``routerreports``: after a restart the routers' next
reports (two seconds away) say more than stale numbers could, and a model with
no live report holds its count (``decide`` with ``signals=None``).

A router that stops reporting ages out after ``stale_after_s``: its gauges
would otherwise hold a model up for ever (a router killed with 30 requests
waiting), and its last arrivals would keep a model from going to zero.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from llmgw.api.routing import BadReport, LoadReport
from llmgw.core import autoscale

__all__ = ["BadReport", "RouterSeen", "RouterSignals", "describe"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Sample:
    """One report's counts for one model (deltas since the router's report before)."""

    at: float  # when it arrived, on this control plane's clock
    arrived: int
    tokens_out: int
    ttft_counts: tuple[int, ...]


@dataclasses.dataclass(slots=True)
class _ModelReport:
    """One router's view of one model: the counts within the window and the gauges as last reported."""

    samples: collections.deque[_Sample] = dataclasses.field(default_factory=collections.deque)
    waiting: float = 0.0
    in_flight: float = 0.0
    held: float = 0.0
    last_request_at: float = 0.0
    replicas: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class _Router:
    first_at: float
    last_at: float
    interval_s: float
    models: dict[str, _ModelReport] = dataclasses.field(default_factory=dict)
    version: str = ""
    protocol: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RouterSeen:
    """A router that reported lately, and the llmgw version and protocol it said ("" and 0: one before 0.2.0)."""

    id: str
    version: str
    protocol: int
    last_report_s: float  # seconds since its last report


class RouterSignals:
    """Every live router's reports, merged per model over ``window_s``; a router silent for ``stale_after_s`` is out."""

    def __init__(self, *, clock: Callable[[], float] = time.time, window_s: float = 30.0,
                 stale_after_s: float = 10.0) -> None:
        self._clock, self.window_s, self.stale_after_s = clock, window_s, stale_after_s
        self._routers: dict[str, _Router] = {}
        #: Called with a model's name when a report holds a request for it (a model at zero must wake now,
        #: not at the next pass): ``Cluster`` kicks a pass. Called on the caller's thread (the event loop).
        self.on_wake: Callable[[str], None] | None = None
        #: Called with each report applied and its arrival time on this clock (``Cluster``: the charts'
        #: history, ``control.history``), on the caller's thread.
        self.on_report: Callable[[LoadReport, float], None] | None = None

    def record(self, doc: LoadReport | Any) -> int:
        """Applies one router's report (a ``LoadReport``, or a posted body: ``BadReport`` names a bad field and
        nothing applies); the number of models it spoke of."""
        return self.apply(LoadReport.from_doc(doc))

    def apply(self, report: LoadReport) -> int:
        """Applies one report already read (``llmgw.api.reports`` says what each field is); a model left out
        has its gauges at 0. The number of models it spoke of."""
        router, interval_s, parsed = report.router, report.interval_s, report.models
        now = self._clock()
        r = self._routers.get(router)
        if r is None or now - r.last_at > self.stale_after_s:
            r = self._routers[router] = _Router(first_at=now, last_at=now, interval_s=interval_s)
        r.last_at, r.interval_s, r.version, r.protocol = now, interval_s, report.version, report.protocol
        said = {p.model for p in parsed}
        for name, m in r.models.items():
            if name not in said:  # left out: nothing to say and every gauge 0
                m.waiting = m.in_flight = m.held = 0.0
                m.replicas = {}
        woken: list[str] = []
        for p in parsed:
            m = r.models.setdefault(p.model, _ModelReport())
            if p.arrived or p.tokens_out or any(p.ttft_counts):
                m.samples.append(_Sample(now, p.arrived, p.tokens_out, p.ttft_counts))
            # A queue that forms is users waiting now: a pass at once, not at the next tick, so the
            # scale-up it asks for starts its replicas that much sooner (decide acts on it at once).
            queue_formed = p.waiting > 0 and m.waiting == 0
            m.waiting, m.in_flight, m.held, m.replicas = p.waiting, p.in_flight, p.held, dict(p.replicas)
            # The router's clock, not ours: kept no later than now, or a router whose clock runs ahead
            # would keep its model from ever being idle long enough to go to zero.
            m.last_request_at = max(m.last_request_at, min(p.last_request_at, now))
            if p.held > 0 or queue_formed:
                woken.append(p.model)
        self._prune(now)
        if self.on_report is not None:
            self.on_report(report, now)
        if self.on_wake is not None:
            for name in woken:
                self.on_wake(name)
        return len(parsed)

    def _prune(self, now: float) -> None:
        """Forgets routers past their staleness and counts older than the window."""
        for router in [k for k, r in self._routers.items() if now - r.last_at > self.stale_after_s]:
            del self._routers[router]
        for r in self._routers.values():
            for m in r.models.values():
                while m.samples and now - m.samples[0].at > self.window_s:
                    m.samples.popleft()

    def routers(self, *, now: float | None = None) -> list[str]:
        """The routers that reported within ``stale_after_s``."""
        at = self._clock() if now is None else now
        return sorted(k for k, r in self._routers.items() if at - r.last_at <= self.stale_after_s)

    def seen(self) -> list[RouterSeen]:
        """The routers that reported within ``stale_after_s``, by id, with the version each said."""
        now = self._clock()
        return [RouterSeen(k, r.version, r.protocol, round(now - r.last_at, 3))
                for k, r in sorted(self._routers.items()) if now - r.last_at <= self.stale_after_s]
    def models(self, now: float) -> set[str]:
        """Every model a live router spoke of (its last report, or a count still in the window)."""
        return {name for r in self._routers.values() if now - r.last_at <= self.stale_after_s for name in r.models}

    def signals(self, model: str, now: float) -> autoscale.Signals | None:
        """``model``'s load merged over every live router; None when no router reported within ``stale_after_s``.

        A live router that has not spoken of the model counts as no load: that is what it would report.
        Rates are over the window, or over the time since a router's first report when that is shorter
        (a router that started two seconds ago with ten arrivals is five a second, not a third of one).
        """
        self._prune(now)
        live = [r for r in self._routers.values() if now - r.last_at <= self.stale_after_s]
        if not live:
            return None
        arrived_per_s = tokens_per_s = waiting = in_flight = held = last = 0.0
        counts = [0] * (len(autoscale.TTFT_BUCKETS_MS) + 1)
        for r in live:
            m = r.models.get(model)
            if m is None:
                continue
            span = max(min(self.window_s, now - r.first_at + r.interval_s), r.interval_s, 1e-9)
            arrived_per_s += sum(s.arrived for s in m.samples) / span
            tokens_per_s += sum(s.tokens_out for s in m.samples) / span
            for s in m.samples:
                for i, c in enumerate(s.ttft_counts):
                    counts[i] += c
            waiting, in_flight, held = waiting + m.waiting, in_flight + m.in_flight, held + m.held
            last = max(last, m.last_request_at)
        return autoscale.Signals(arrived_per_s=arrived_per_s, waiting=waiting, in_flight=in_flight,
                                 ttft_p90_ms=autoscale.ttft_quantile(counts, 0.9) if any(counts) else None,
                                 tokens_per_s=tokens_per_s, last_request_at=last, wanted=held > 0)

    def replica_load(self, model: str) -> dict[str, float]:
        """Requests in flight at each of ``model``'s replicas, summed over the live routers."""
        now = self._clock()
        out: dict[str, float] = {}
        for r in self._routers.values():
            m = r.models.get(model)
            if m is None or now - r.last_at > self.stale_after_s:
                continue
            for rid, n in m.replicas.items():
                out[rid] = out.get(rid, 0.0) + n
        return out

    def load(self) -> dict[str, float]:
        """Requests in flight at every replica any live router spoke of, by replica id (what reconcile reads)."""
        now = self._clock()
        out: dict[str, float] = {}
        for r in self._routers.values():
            if now - r.last_at > self.stale_after_s:
                continue
            for m in r.models.values():
                for rid, n in m.replicas.items():
                    out[rid] = out.get(rid, 0.0) + n
        return out


def describe(auto: autoscale.Autoscale, replicas: int, *, last_reason: str, last_change_at: float,
             signals: RouterSignals | None, model: str, now: float) -> dict[str, Any]:
    """An autoscaled model's ``status.autoscale`` (GET /api/v1/models/NAME, ``llmgw describe model``)."""
    merged = signals.signals(model, now) if signals is not None else None
    return {
        "replicas": replicas, "min_replicas": auto.min_replicas, "max_replicas": auto.max_replicas,
        "last_reason": last_reason, "last_change_at": last_change_at,
        # null: no router reported within its staleness (the count holds); else what decide() reads.
        "signals": dataclasses.asdict(merged) if merged is not None else None,
        "routers": signals.routers(now=now) if signals is not None else [],
    }
