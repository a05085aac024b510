"""The leader's short history of what it already hears: per model and per node, for the UI's charts (issue 30).

Fed from three places the control plane already has, no Prometheus needed:

* each router's ``LoadReport`` (``loadreports.RouterSignals`` hands it over as it applies it): a model's
  requests, errors, tokens in and out, and its TTFT histogram, all counts since the router's report
  before, summed over routers into the bucket they arrive in;
* a sample each control-loop pass (``Cluster.run``, about once a second, while leading): a model's queue
  (waiting) and in flight merged over the live routers, and its replicas by state from the agents'
  shard reports;
* each agent heartbeat: the node's CPU %, memory used, disk used (summed over its disks) and each GPU's
  memory used and utilisation (percent; a gap where the agent does not report it: an older agent, a
  driver that cannot measure it).

Kept in ``core.history.Series`` rings: 1 h at 10 s and 24 h at 1 min (1800 slots). By
``core.history``'s arithmetic, a model's 26 fields (6 gauges) take 1800 × (26 × 4 + 6 × 4 + 8) = 244,800 bytes
(~239 KiB); a node's 3 fields + 2 per GPU (all gauges) 1800 × (8 × (3 + 2G) + 8): 57,600 bytes (~56 KiB)
without GPUs, 288,000 (~281 KiB) with 8 (``bench/history.py`` measures it). At most ``MAX_MODELS`` (256:
~60 MiB) models and ``MAX_NODES`` (512: ~28 MiB without GPUs, ~141 MiB with 8 each) nodes are charted;
past that a new one takes the place of the one written least recently if that one has been quiet for
``IDLE_S`` (10 min), else it is not charted (logged once), so a fleet larger than the cap does not churn.
In memory on the leader only: a failover starts the new leader's charts empty (they fill
again at the next reports), which costs nothing a restart would not; a standby's UI and API calls are
forwarded to the leader (``http.forward``), so every reader sees the leader's.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from typing import Literal

from llmgw.api.routing import LoadReport
from llmgw.core import autoscale
from llmgw.core.history import Field, Kind, Series
from llmgw.core.inventory import Heartbeat
from llmgw.core.shards import ShardState, ShardStatus

log = logging.getLogger(__name__)
Scope = Literal["model", "node"]
#: The most models and nodes charted: ~60 MiB and ~28-141 MiB at most (see the docstring).
MAX_MODELS, MAX_NODES = 256, 512
#: A series not written for this long may be dropped for a new one once the cap is reached.
IDLE_S = 600.0
#: The windows a reader may ask for, by name: seconds.
WINDOWS = {"5m": 300, "15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400}
TTFT_FIELDS = tuple(f"ttft_{i}" for i in range(len(autoscale.TTFT_BUCKETS_MS) + 1))
COUNTERS = ("requests", "errors", "tokens_in", "tokens_out")
REPLICA_STATES = ("ready", "starting", "unhealthy", "draining")
MODEL_FIELDS = (*(Field(n, Kind.SUM) for n in (*COUNTERS, *TTFT_FIELDS)), Field("waiting"), Field("in_flight"),
                *(Field(f"replicas_{s}") for s in REPLICA_STATES))
_STATE_OF = {ShardState.READY: "ready", ShardState.STARTING: "starting", ShardState.FETCHING: "starting",
             ShardState.UNHEALTHY: "unhealthy", ShardState.FAILED: "unhealthy", ShardState.DRAINING: "draining",
             ShardState.DRAINED: "draining"}
#: A replica's state is its worst shard's, in this order.
_WORST = ("unhealthy", "starting", "draining", "ready")


def node_fields(gpus: int) -> tuple[Field, ...]:
    """A node's fields: what is used (the totals barely move: the node's inventory says them), and how busy
    each GPU was (percent; a gap where its agent does not report it)."""
    return (Field("cpu_percent"), Field("memory_used"), Field("disk_used"),
            *(Field(f"gpu{i}_memory_used") for i in range(gpus)), *(Field(f"gpu{i}_util") for i in range(gpus)))


@dataclasses.dataclass(frozen=True, slots=True)
class Line:
    """One drawn line: its name, unit, and a value per bucket (None: a gap)."""

    name: str
    unit: str
    values: tuple[float | None, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    title: str
    unit: str
    lines: tuple[Line, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """A series read over a window: the buckets' start times and the charts drawn from them."""

    scope: Scope
    name: str
    window_s: int
    step_s: int
    times: tuple[int, ...]
    charts: tuple[Chart, ...]


class MetricsHistory:
    """Every model's and node's ``Series``, recorded as reports arrive, read as ``View``s."""

    def __init__(self, *, max_models: int = MAX_MODELS, max_nodes: int = MAX_NODES, idle_s: float = IDLE_S,
                 sample_every_s: float = 2.0) -> None:
        self._caps: dict[Scope, int] = {"model": max_models, "node": max_nodes}
        self.idle_s, self.sample_every_s = idle_s, sample_every_s
        self._series: dict[Scope, collections.OrderedDict[str, Series]] = {
            "model": collections.OrderedDict(), "node": collections.OrderedDict()}
        self._sampled_at = -math.inf
        self._full_logged = False

    def __len__(self) -> int:
        return sum(len(d) for d in self._series.values())

    def nbytes(self) -> int:
        return sum(s.nbytes() for d in self._series.values() for s in d.values())

    def _get(self, scope: Scope, name: str, fields: tuple[Field, ...], now: float) -> Series | None:
        """``name``'s series (made when new); None when the cap is reached and no series is idle to drop."""
        series = self._series[scope]
        s = series.get(name)
        if s is None or s.fields != fields:  # a node whose GPUs changed starts afresh
            if s is None and len(series) >= self._caps[scope]:
                oldest_name, oldest = next(iter(series.items()))
                if now - oldest.last_at < self.idle_s:
                    if not self._full_logged:
                        self._full_logged = True
                        log.warning("metrics history: %d %ss already charted, each written within %.0fs; %s %r "
                                    "is not charted until one goes quiet", self._caps[scope], scope, self.idle_s,
                                    scope, name)
                    return None
                del series[oldest_name]
            s = series[name] = Series(fields)
        series.move_to_end(name)
        return s

    def due(self, now: float) -> bool:
        """Whether a pass at ``now`` should ``sample`` (every ``sample_every_s``): True once per period."""
        if now - self._sampled_at < self.sample_every_s:
            return False
        self._sampled_at = now
        return True

    # -- recording -------------------------------------------------------------------------------
    def load_report(self, report: LoadReport, now: float) -> None:
        """A router's report, as ``RouterSignals.apply`` applies it: its counts, at ``now`` (our clock)."""
        for m in report.models:
            # Only what is not 0 (most TTFT buckets are empty): the bucket is marked seen all the same.
            values = {k: v for k, v in (("requests", m.arrived), ("errors", m.errors), ("tokens_in", m.tokens_in),
                                        ("tokens_out", m.tokens_out), *zip(TTFT_FIELDS, m.ttft_counts, strict=False))
                      if v}
            if (series := self._get("model", m.model, MODEL_FIELDS, now)) is not None:
                series.record(now, values)

    def sample(self, now: float, gauges: Mapping[str, tuple[float, float]], shards: Iterable[ShardStatus]) -> None:
        """One pass's gauges: ``gauges`` a model's (waiting, in flight) over the live routers; ``shards`` every
        shard the agents reported, counted into replicas by state per model."""
        replicas: dict[str, dict[str, str]] = {}
        for st in shards:
            state = _STATE_OF.get(st.state)
            if state is None or st.spec is None:
                continue  # stopped, stopping: not a replica serving or becoming one
            per_model = replicas.setdefault(st.spec.model, {})
            before = per_model.get(st.replica_id)
            if before is None or _WORST.index(state) < _WORST.index(before):
                per_model[st.replica_id] = state
        for model in {*gauges, *replicas}:
            waiting, in_flight = gauges.get(model, (0.0, 0.0))
            counts = collections.Counter(replicas.get(model, {}).values())
            values = {"waiting": waiting, "in_flight": in_flight}
            values.update({f"replicas_{s}": float(counts.get(s, 0)) for s in REPLICA_STATES})
            if (series := self._get("model", model, MODEL_FIELDS, now)) is not None:
                series.record(now, values)

    def heartbeat(self, node_id: str, hb: Heartbeat, now: float) -> None:
        """A node's heartbeat: its gauges (GPUs and disks as the heartbeat lists them)."""
        series = self._get("node", node_id, node_fields(len(hb.gpus)), now)
        if series is None:
            return
        values: dict[str, float] = {
            "cpu_percent": hb.cpu_percent,
            "memory_used": max(0, hb.memory_total_bytes - hb.memory_available_bytes),
        }
        if hb.disks:
            values["disk_used"] = sum(max(0, d.total_bytes - d.free_bytes) for d in hb.disks)
        for i, g in enumerate(hb.gpus):
            values[f"gpu{i}_memory_used"] = g.memory_used_bytes
            if g.utilization_percent is not None:  # unknown is a gap, not an idle 0 %
                values[f"gpu{i}_util"] = float(g.utilization_percent)
        series.record(now, values)

    # -- reading ---------------------------------------------------------------------------------
    def view(self, scope: Scope, name: str, window_s: int, now: float) -> View | None:
        """``name``'s charts over the last ``window_s``; None when nothing was recorded for it."""
        s = self._series[scope].get(name)
        if s is None:
            return None
        tier, rows = s.read(now, window_s)
        times = tuple(t for t, _ in rows)
        names = [f.name for f in s.fields]
        cols: dict[str, list[float | None]] = {n: [None if r is None else r[i] for _, r in rows]
                                               for i, n in enumerate(names)}
        # The bucket holding ``now`` has counted only since it began: its rate is over that much, not a whole
        # step (else every chart dipped at its right edge). At least a router's interval (2 s).
        elapsed = min(float(tier.step_s), max(2.0, now - times[-1]))
        charts = _model_charts(cols, tier.step_s, elapsed) if scope == "model" else _node_charts(cols, names)
        return View(scope=scope, name=name, window_s=window_s, step_s=tier.step_s, times=times, charts=charts)


_BOUNDS = tuple(float(b) for b in autoscale.TTFT_BUCKETS_MS)


def ttft_quantiles(cells: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> list[float | None]:
    """``core.autoscale.ttft_quantile`` of one histogram at each of ``qs`` (ascending), in one pass: a
    chart's day reads 1440 of them, and three separate calls each took ~40 ms of the loop per model."""
    total = sum(cells)
    if total <= 0:
        return [None] * len(qs)
    out: list[float | None] = []
    ranks = [q * total for q in qs]
    seen, lower, k = 0.0, 0.0, 0
    for upper, count in zip(_BOUNDS, cells, strict=False):
        while k < len(ranks) and count and seen + count >= ranks[k]:
            out.append(lower + (upper - lower) * (ranks[k] - seen) / count)
            k += 1
        seen += count
        lower = upper
    out += [_BOUNDS[-1]] * (len(qs) - k)
    return out


def _model_charts(cols: dict[str, list[float | None]], step_s: int, last_s: float) -> tuple[Chart, ...]:
    def _rate(values: list[float | None], _: int) -> tuple[float | None, ...]:
        n = len(values)
        return tuple(None if v is None else v / (last_s if i == n - 1 else step_s) for i, v in enumerate(values))

    n = len(cols["requests"])
    quantiles: dict[str, list[float | None]] = {"p50": [], "p90": [], "p99": []}
    ttft_cols = [cols[f] for f in TTFT_FIELDS]
    for i in range(n):
        if cols["requests"][i] is None:  # a gap: no histogram there
            for v in quantiles.values():
                v.append(None)
            continue
        for key, value in zip(quantiles, ttft_quantiles([c[i] or 0.0 for c in ttft_cols]), strict=True):
            quantiles[key].append(value)
    return (
        Chart("Requests", "/s", (Line("requests", "/s", _rate(cols["requests"], step_s)),
                                 Line("errors", "/s", _rate(cols["errors"], step_s)))),
        Chart("Time to first token", " ms", tuple(Line(k, " ms", tuple(v)) for k, v in quantiles.items())),
        Chart("Tokens", "/s", (Line("in", "/s", _rate(cols["tokens_in"], step_s)),
                               Line("out", "/s", _rate(cols["tokens_out"], step_s)))),
        Chart("Queue", "", (Line("waiting", "", tuple(cols["waiting"])),
                            Line("in flight", "", tuple(cols["in_flight"])))),
        Chart("Replicas", "", tuple(Line(s, "", tuple(cols[f"replicas_{s}"])) for s in REPLICA_STATES)),
    )


def _node_charts(cols: dict[str, list[float | None]], names: list[str]) -> tuple[Chart, ...]:
    gpus = sorted({n.split("_", 1)[0] for n in names if n.startswith("gpu")}, key=lambda g: int(g[3:]))
    charts = [
        Chart("CPU", "%", (Line("cpu", "%", tuple(cols["cpu_percent"])),)),
        Chart("Memory used", "B", (Line("memory", "B", tuple(cols["memory_used"])),)),
        Chart("Disk used", "B", (Line("disk", "B", tuple(cols["disk_used"])),)),
    ]
    if gpus:
        charts.append(Chart("GPU memory", "B", tuple(Line(f"{g} used", "B", tuple(cols[f"{g}_memory_used"]))
                                                     for g in gpus)))
        charts.append(Chart("GPU utilisation", "%", tuple(Line(g, "%", tuple(cols[f"{g}_util"])) for g in gpus)))
    return tuple(charts)
