"""What routers report about each model's load, merged for the autoscaler (issue 17).

Every router sends, every couple of seconds and at once when it holds a request
for a model at zero, one document per router (``llmgw.router.signals`` builds
it; the shape is in the module docstring of ``RouterSignals.record``): counts
since its last report (arrivals, first-token times, output tokens) and gauges
as they stand (waiting, in flight, held, in flight per replica). Here those are
checked, kept per router over a sliding window, and merged into the one
``core.autoscale.Signals`` per model that ``core.autoscale.decide`` reads.

Kept in memory only, like ``router_events``: after a restart the routers' next
reports (two seconds away) say more than stale numbers could, and a model with
no live report holds its count (``decide`` with ``signals=None``).

A router that stops reporting ages out after ``stale_after_s``: its gauges
would otherwise hold a model up for ever (a router killed with 30 requests
waiting), and its last arrivals would keep a model from going to zero.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.core import autoscale

#: More models than one report may carry: a document this big is not a router's.
MAX_MODELS_PER_REPORT = 1000
MAX_REPLICAS_PER_MODEL = 1000
MAX_ROUTER_ID = 253


class BadReport(ValueError):
    """A signals report that is not what routers send; the message names the field and what was expected."""


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


@dataclasses.dataclass(frozen=True, slots=True)
class _Parsed:
    model: str
    arrived: int
    waiting: float
    in_flight: float
    held: float
    ttft_counts: tuple[int, ...]
    tokens_out: int
    last_request_at: float
    replicas: dict[str, float]


class RouterSignals:
    """Every live router's reports, merged per model over ``window_s``; a router silent for ``stale_after_s`` is out."""

    def __init__(self, *, clock: Callable[[], float] = time.time, window_s: float = 30.0,
                 stale_after_s: float = 10.0) -> None:
        self._clock, self.window_s, self.stale_after_s = clock, window_s, stale_after_s
        self._routers: dict[str, _Router] = {}
        #: Called with a model's name when a report holds a request for it (a model at zero must wake now,
        #: not at the next pass): ``Cluster`` kicks a pass. Called on the caller's thread (the event loop).
        self.on_wake: Callable[[str], None] | None = None

    def record(self, doc: Any) -> int:
        """Applies one router's report; the number of models it spoke of. Raises BadReport (nothing applied).

        ``{"router": "r1", "interval_s": 2.0, "sent_at": 1764662400.0, "models": [{"model": "m", "arrived": 12,
        "waiting": 3, "in_flight": 5, "held": 0, "ttft_counts": [...], "tokens_out": 345, "last_request_at": ...,
        "replicas": {"m-ab12cd": {"in_flight": 2}}}]}``: arrived, ttft_counts and tokens_out are counts since the
        router's last report; the others are gauges now. A model left out has its gauges at 0.
        """
        router, interval_s, parsed = _parse(doc)  # every field checked before anything applies
        now = self._clock()
        r = self._routers.get(router)
        if r is None or now - r.last_at > self.stale_after_s:
            r = self._routers[router] = _Router(first_at=now, last_at=now, interval_s=interval_s)
        r.last_at, r.interval_s = now, interval_s
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
            m.waiting, m.in_flight, m.held, m.replicas = p.waiting, p.in_flight, p.held, p.replicas
            # The router's clock, not ours: kept no later than now, or a router whose clock runs ahead
            # would keep its model from ever being idle long enough to go to zero.
            m.last_request_at = max(m.last_request_at, min(p.last_request_at, now))
            if p.held > 0 or queue_formed:
                woken.append(p.model)
        self._prune(now)
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


# -- checking a report -----------------------------------------------------------------------
def _number(where: str, raw: Any, *, default: float = 0.0) -> float:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        raise BadReport(f"{where}: expected a number >= 0, got {raw!r}")
    return float(raw)


def _count(where: str, raw: Any) -> int:
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise BadReport(f"{where}: expected a whole number >= 0 (a count since the last report), got {raw!r}")
    return raw


def _parse(doc: Any) -> tuple[str, float, list[_Parsed]]:
    if not isinstance(doc, Mapping):
        raise BadReport("body: expected an object with router, interval_s and models")
    router = doc.get("router")
    if not isinstance(router, str) or not router or len(router) > MAX_ROUTER_ID:
        raise BadReport(f"router: expected the reporting router's id, a non-empty string of at most "
                        f"{MAX_ROUTER_ID} characters, got {router!r}")
    interval_s = _number("interval_s", doc.get("interval_s"), default=2.0)
    if interval_s <= 0:
        raise BadReport("interval_s: expected how often the router reports, in seconds (> 0), got 0")
    _number("sent_at", doc.get("sent_at"))
    models = doc.get("models")
    if not isinstance(models, list):
        raise BadReport(f"models: expected a list of per-model reports, got {type(models).__name__}")
    if len(models) > MAX_MODELS_PER_REPORT:
        raise BadReport(f"models: at most {MAX_MODELS_PER_REPORT} per report, got {len(models)}")
    out, seen = [], set()
    for i, raw in enumerate(models):
        p = _model(f"models[{i}]", raw)
        if p.model in seen:
            raise BadReport(f"models[{i}].model: {p.model!r} is reported twice; one entry per model")
        seen.add(p.model)
        out.append(p)
    return router, interval_s, out


def _model(where: str, raw: Any) -> _Parsed:
    if not isinstance(raw, Mapping):
        raise BadReport(f"{where}: expected an object")
    name = raw.get("model")
    if not isinstance(name, str) or not name:
        raise BadReport(f"{where}.model: expected the model's name, a non-empty string, got {name!r}")
    buckets = len(autoscale.TTFT_BUCKETS_MS) + 1
    ttft = raw.get("ttft_counts")
    if ttft is None:
        counts: tuple[int, ...] = (0,) * buckets
    elif not isinstance(ttft, list) or len(ttft) != buckets:
        raise BadReport(f"{where}.ttft_counts: expected a list of {buckets} counts (one per TTFT bucket, the last "
                        f"+inf), got {len(ttft) if isinstance(ttft, list) else type(ttft).__name__}")
    else:
        counts = tuple(_count(f"{where}.ttft_counts[{k}]", c) for k, c in enumerate(ttft))
    reps = raw.get("replicas")
    replicas: dict[str, float] = {}
    if reps is not None:
        if not isinstance(reps, Mapping) or len(reps) > MAX_REPLICAS_PER_MODEL:
            raise BadReport(f"{where}.replicas: expected an object of at most {MAX_REPLICAS_PER_MODEL} replica "
                            "ids, each {\"in_flight\": N}")
        for rid, v in reps.items():
            if not isinstance(rid, str) or not rid or not isinstance(v, Mapping):
                raise BadReport(f"{where}.replicas[{rid!r}]: expected a replica id and {{\"in_flight\": N}}")
            replicas[rid] = _number(f"{where}.replicas[{rid!r}].in_flight", v.get("in_flight"))
    return _Parsed(model=name, arrived=_count(f"{where}.arrived", raw.get("arrived")),
                   waiting=_number(f"{where}.waiting", raw.get("waiting")),
                   in_flight=_number(f"{where}.in_flight", raw.get("in_flight")),
                   held=_number(f"{where}.held", raw.get("held")), ttft_counts=counts,
                   tokens_out=_count(f"{where}.tokens_out", raw.get("tokens_out")),
                   last_request_at=_number(f"{where}.last_request_at", raw.get("last_request_at")),
                   replicas=replicas)


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
