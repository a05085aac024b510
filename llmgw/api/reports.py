"""What routers report to the control plane, as typed documents: ``RouterReport`` and ``LoadReport``.

Part of the control plane <-> router contract (``llmgw.api.routing`` is its front). Routers build these
and send ``to_doc()`` (``POST /api/v1/router/events``, ``POST /api/v1/router/signals``), or hand the objects
over in process (``llmgw server``). The control plane reads a posted body with ``from_doc``, which is
strict: every field it uses is checked before anything applies, and a bad one is refused with
``BadReport`` naming it (the REST API answers 422 with that sentence). A field it does not know is ignored,
so a newer router still reports to this control plane.

A ``RouterReport``::

    {"router": "r1", "events": [
        {"type": "ejected", "model": "m", "replica": "m-1a2b3c", "for_s": 2.0, "failures": 3,
         "reason": "Cannot connect to host ...", "at": 1764583200.0},
        {"type": "recovered", "model": "m", "replica": "m-1a2b3c", "at": ...},
        {"type": "key_used", "key": "key-1a2b3c", "at": 1764583200.0}]}

A ``LoadReport``::

    {"router": "r1", "interval_s": 2.0, "sent_at": 1764662400.0, "version": "0.2.0", "protocol": 2,
     "models": [{"model": "m", "arrived": 12, "waiting": 3, "in_flight": 5, "held": 0,
                 "ttft_counts": [0, 1, 4, ...], "tokens_out": 345, "last_request_at": 1764662399.5,
                 "errors": 0, "tokens_in": 1200,
                 "replicas": {"m-ab12cd": {"in_flight": 2}, "m-ef34gh": {"in_flight": 3}}}]}

``arrived``, ``ttft_counts`` (over ``core.autoscale.TTFT_BUCKETS_MS``, +inf last) and ``tokens_out`` are
counts since the router's report before; the others are gauges as they stand.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from llmgw.core import autoscale

#: More events than one report may carry.
MAX_EVENTS_PER_BATCH = 1000
#: More models than one load report may carry: a document this big is not a router's.
MAX_MODELS_PER_REPORT = 1000
MAX_REPLICAS_PER_MODEL = 1000
MAX_ROUTER_ID = 253
MAX_VERSION = 64
#: A load report's count of TTFT buckets: one per bound, and +inf.
TTFT_BUCKETS = len(autoscale.TTFT_BUCKETS_MS) + 1


class WireError(ValueError):
    """A document that is not what the other side sends; the message names the field."""


class BadReport(WireError):
    """A router's report the control plane refuses; the message names the field and what was expected."""


# -- what a router saw -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Ejected:
    """A replica this router took out of rotation for ``for_s`` after ``failures`` failed requests."""

    model: str
    replica: str
    for_s: float = 0.0
    failures: int = 1
    reason: str = ""
    at: float | None = None  # the router's wall clock; None: when it arrives

    def to_doc(self) -> dict[str, Any]:
        return _with_at({"type": "ejected", "model": self.model, "replica": self.replica, "for_s": self.for_s,
                         "failures": self.failures, "reason": self.reason}, self.at)


@dataclasses.dataclass(frozen=True, slots=True)
class Recovered:
    """A replica this router had ejected answers again."""

    model: str
    replica: str
    at: float | None = None

    def to_doc(self) -> dict[str, Any]:
        return _with_at({"type": "recovered", "model": self.model, "replica": self.replica}, self.at)


@dataclasses.dataclass(frozen=True, slots=True)
class KeyUsed:
    """The newest time this router let the API key ``key`` in."""

    key: str
    at: float | None = None

    def to_doc(self) -> dict[str, Any]:
        return _with_at({"type": "key_used", "key": self.key}, self.at)


RouterEvent = Ejected | Recovered | KeyUsed


@dataclasses.dataclass(frozen=True, slots=True)
class RouterReport:
    """One router's events, oldest first."""

    router: str
    events: tuple[RouterEvent, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"router": self.router, "events": [e.to_doc() for e in self.events]}

    @classmethod
    def from_doc(cls, doc: Any) -> RouterReport:
        """Strict: ``BadReport`` names the first field that is not what routers send."""
        if isinstance(doc, RouterReport):
            return doc
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
        return cls(router=router, events=tuple(_event(f"events[{i}]", e) for i, e in enumerate(events)))


def _with_at(doc: dict[str, Any], at: float | None) -> dict[str, Any]:
    if at is not None:
        doc["at"] = at
    return doc


def _event(where: str, raw: Any) -> RouterEvent:
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
    at = raw.get("at")
    if kind == "key_used":
        return KeyUsed(key=raw["key"], at=at)
    if kind == "recovered":
        return Recovered(model=raw["model"], replica=raw["replica"], at=at)
    return Ejected(model=raw["model"], replica=raw["replica"], for_s=raw.get("for_s") or 0.0,
                   failures=failures or 1, reason=str(raw.get("reason") or ""), at=at)


# -- the load a router sees --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model's load at one router: counts since its report before, and gauges now."""

    model: str
    arrived: int = 0
    waiting: float = 0.0  # admission's queue and the requests held at zero
    in_flight: float = 0.0
    held: float = 0.0
    ttft_counts: tuple[int, ...] = (0,) * TTFT_BUCKETS
    tokens_out: int = 0
    last_request_at: float = 0.0  # the router's wall clock; 0: none since it started
    #: Requests answered 5xx (or never answered) since the report before; absent from an older router: 0.
    errors: int = 0
    #: Prompt tokens of the metered requests that ended since the report before (the engine's usage); 0 when
    #: nothing is metered. Absent from an older router: 0. Both are read by the UI's charts only.
    tokens_in: int = 0
    #: Requests in flight at each of the model's replicas, by replica id.
    replicas: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"model": self.model, "arrived": self.arrived, "waiting": self.waiting, "in_flight": self.in_flight,
                "held": self.held, "ttft_counts": list(self.ttft_counts), "tokens_out": self.tokens_out,
                "last_request_at": self.last_request_at, "errors": self.errors, "tokens_in": self.tokens_in,
                "replicas": {rid: {"in_flight": n} for rid, n in self.replicas.items()}}


@dataclasses.dataclass(frozen=True, slots=True)
class LoadReport:
    """One router's load report: a ``ModelLoad`` per model it has something to say of (the rest: no load)."""

    router: str
    interval_s: float = 2.0
    sent_at: float = 0.0
    models: tuple[ModelLoad, ...] = ()
    #: The router's llmgw version and wire protocol (``core.skew``), for ``llmgw version``; ""/0: a router before
    #: 0.2.0, which said neither.
    version: str = ""
    protocol: int = 0

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"router": self.router, "interval_s": self.interval_s, "sent_at": self.sent_at,
                               "models": [m.to_doc() for m in self.models]}
        if self.version:
            doc["version"] = self.version
        if self.protocol:
            doc["protocol"] = self.protocol
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> LoadReport:
        """Strict: ``BadReport`` names the first field that is not what routers send."""
        if isinstance(doc, LoadReport):
            return doc
        if not isinstance(doc, Mapping):
            raise BadReport("body: expected an object with router, interval_s and models")
        router = doc.get("router")
        if not isinstance(router, str) or not router or len(router) > MAX_ROUTER_ID:
            raise BadReport(f"router: expected the reporting router's id, a non-empty string of at most "
                            f"{MAX_ROUTER_ID} characters, got {router!r}")
        interval_s = _number("interval_s", doc.get("interval_s"), default=2.0)
        if interval_s <= 0:
            raise BadReport("interval_s: expected how often the router reports, in seconds (> 0), got 0")
        sent_at = _number("sent_at", doc.get("sent_at"))
        models = doc.get("models")
        if not isinstance(models, list):
            raise BadReport(f"models: expected a list of per-model reports, got {type(models).__name__}")
        if len(models) > MAX_MODELS_PER_REPORT:
            raise BadReport(f"models: at most {MAX_MODELS_PER_REPORT} per report, got {len(models)}")
        out: list[ModelLoad] = []
        seen: set[str] = set()
        for i, raw in enumerate(models):
            m = _model_load(f"models[{i}]", raw)
            if m.model in seen:
                raise BadReport(f"models[{i}].model: {m.model!r} is reported twice; one entry per model")
            seen.add(m.model)
            out.append(m)
        version = doc.get("version", "")
        if not isinstance(version, str) or len(version) > MAX_VERSION:
            raise BadReport(f"version: expected the router's llmgw version, a string of at most {MAX_VERSION} "
                            f"characters, got {str(version)[:80]!r}")
        protocol = _count("protocol", doc.get("protocol"))
        return cls(router=router, interval_s=interval_s, sent_at=sent_at, models=tuple(out), version=version,
                   protocol=protocol)


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


def _model_load(where: str, raw: Any) -> ModelLoad:
    if not isinstance(raw, Mapping):
        raise BadReport(f"{where}: expected an object")
    name = raw.get("model")
    if not isinstance(name, str) or not name:
        raise BadReport(f"{where}.model: expected the model's name, a non-empty string, got {name!r}")
    ttft = raw.get("ttft_counts")
    if ttft is None:
        counts: tuple[int, ...] = (0,) * TTFT_BUCKETS
    elif not isinstance(ttft, list) or len(ttft) != TTFT_BUCKETS:
        raise BadReport(f"{where}.ttft_counts: expected a list of {TTFT_BUCKETS} counts (one per TTFT bucket, the "
                        f"last +inf), got {len(ttft) if isinstance(ttft, list) else type(ttft).__name__}")
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
    return ModelLoad(model=name, arrived=_count(f"{where}.arrived", raw.get("arrived")),
                     waiting=_number(f"{where}.waiting", raw.get("waiting")),
                     in_flight=_number(f"{where}.in_flight", raw.get("in_flight")),
                     held=_number(f"{where}.held", raw.get("held")), ttft_counts=counts,
                     tokens_out=_count(f"{where}.tokens_out", raw.get("tokens_out")),
                     last_request_at=_number(f"{where}.last_request_at", raw.get("last_request_at")),
                     errors=_count(f"{where}.errors", raw.get("errors")),
                     tokens_in=_count(f"{where}.tokens_in", raw.get("tokens_in")), replicas=replicas)
