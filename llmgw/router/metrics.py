"""The router's Prometheus metrics: one registry, shared by every module that counts something.

Labels are model and replica ids, never request content, so cardinality is
bounded by the size of the cluster. A request for a model the table does not
know is counted under ``model=""``: the client's string as a label would let
any client mint series. ``replica=""`` means the router answered itself.

The hot path touches only pre-resolved children: ``series(model)`` returns the
labelled histograms and gauge of one model, resolved once and cached, so a
streamed chunk costs one ``perf_counter()`` and one ``observe``.

The per-request series (requests, TTFT, ITL, duration, in flight, overhead) are
not prometheus_client's own metric objects but plain counters behind one
``_Collector``: each prometheus_client update takes a lock and checks its
arguments, and the seven of them per request were a tenth of the router's time
at capacity. The router updates them from its one event-loop thread; a scrape
from another thread reads each list once, so it may see a request in a bucket
whose ``_sum`` does not have it yet, which Prometheus's rate() tolerates.

Buckets are set for LLM latencies: a chunk gap is milliseconds, a first token
milliseconds to a minute behind a long prompt or a queue, a whole request up
to many minutes; the router's own share is tenths of a millisecond.

The queue gauges stay at 0 until the admission queue exists (it comes with API
keys and their limits); they are exported now so dashboards and alerts can be
written against their final names.

In the server process the control plane serves ``/metrics``; it merges these by
registering ``REGISTRY`` as a collector of its own registry (a registry is a
collector), or by appending ``render()``'s body to its own.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import prometheus_client as prom
from prometheus_client import metrics_core

if TYPE_CHECKING:  # signals imports the table, which imports admission, which imports this module
    from llmgw.router.metering import Metered
    from llmgw.router.signals import ModelCounts

REGISTRY = prom.CollectorRegistry()

#: A first token: from a fast cache hit to a minute of prefill or waiting.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: The gap between chunks: a few ms on a fast GPU, seconds when the engine is overloaded.
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: A whole request: an embedding in ms, a long generation in many minutes.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                    1800.0)
#: The router's own time: tenths of a millisecond when healthy.
#: A cold start: an engine process loading weights, from a second (a small model cached on the node)
#: to minutes (a large one fetched first); the goal for a small model is under 3 s.
COLD_START_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

RETRIES = prom.Counter("llmgw_router_retries_total", "Requests retried on another endpoint before any byte was sent",
                       ["model", "replica"], registry=REGISTRY)
PREFILL_WAITS = prom.Counter("llmgw_router_prefill_waits_total",
                             "Requests held until another request sharing their prompt prefix on the same "
                             "replica had its first token, so the engine reuses that prefix",
                             ["model", "replica"], registry=REGISTRY)
COLD_START = prom.Histogram("llmgw_router_cold_start_seconds",
                          "Requests held for a model at zero: arrival at the router to the first token sent "
                          "to the client (a whole answer: to the answer)", ["model"], buckets=COLD_START_BUCKETS,
                          registry=REGISTRY)
EJECTIONS = prom.Counter("llmgw_router_ejections_total", "Endpoints taken out of rotation after consecutive failures",
                         ["model", "replica"], registry=REGISTRY)


class Histogram:
    """Bucket counts and a sum, for one label set; ``observe`` is a bisect and two additions."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        counts, total = list(self.counts), self.sum
        cumulative, out = 0, []
        for bound, n in zip((*map(prom.utils.floatToGoString, self.bounds), "+Inf"), counts, strict=True):
            cumulative += n
            out.append((bound, float(cumulative)))
        return out, total


class Gauge:
    """An up-down count for one label set."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


@dataclasses.dataclass(frozen=True)
class _HistogramFamily:
    name: str
    doc: str
    buckets: tuple[float, ...]


TTFT = _HistogramFamily("llmgw_router_time_to_first_token_seconds",
                        "Streamed requests: arrival at the router to the first engine chunk sent to the client",
                        TTFT_BUCKETS)
ITL = _HistogramFamily("llmgw_router_inter_token_latency_seconds",
                       "Streamed requests: time between successive chunks relayed to the client", ITL_BUCKETS)
DURATION = _HistogramFamily("llmgw_router_request_duration_seconds",
                            "Arrival at the router to the last byte sent to the client", DURATION_BUCKETS)
REQUESTS_DOC = ("Requests answered, by model, the replica that answered (empty: the router itself) and "
                "HTTP status (499: the client left first)")
USAGE_REQUESTS_DOC = "Metered requests, by project and model (past 1000 pairs: project=model=\"other\")"
USAGE_TOKENS_DOC = "Tokens the engines reported (usage), by project, model and kind (prompt, completion)"
IN_FLIGHT_DOC = "Requests being forwarded now"
OVERHEAD_DOC = ("The router's own time per request: arrival to the upstream request, plus the first "
                "upstream byte to the first byte sent to the client")
#: The router's own time, every model together.
OVERHEAD = Histogram(OVERHEAD_BUCKETS)


# QUEUED is kept by admission (requests waiting for a model's slot); QUEUE_OLDEST is not set yet.
QUEUED = prom.Gauge("llmgw_router_queued_requests", "Requests waiting in the router's admission queue",
                    registry=REGISTRY)
QUEUE_OLDEST = prom.Gauge("llmgw_router_queue_oldest_seconds", "Age of the oldest request in the admission queue",
                          registry=REGISTRY)


def count_retry(model: str, replica: str) -> None:
    RETRIES.labels(model=model, replica=replica).inc()


def count_prefill_wait(model: str, replica: str) -> None:
    PREFILL_WAITS.labels(model=model, replica=replica).inc()


def count_ejection(model: str, replica: str) -> None:
    EJECTIONS.labels(model=model, replica=replica).inc()


@dataclasses.dataclass(frozen=True, slots=True)
class Series:
    """One model's pre-resolved children, so the hot path never formats labels."""

    ttft: Histogram
    itl: Histogram
    duration: Histogram
    in_flight: Gauge


_series: dict[str, Series] = {}
_requests: dict[tuple[str, str, int], list[int]] = {}


def series(model: str) -> Series:
    """The children for ``model`` (a table name, never a client's string), resolved once."""
    found = _series.get(model)
    if found is None:
        found = _series[model] = Series(ttft=Histogram(TTFT_BUCKETS), itl=Histogram(ITL_BUCKETS),
                                        duration=Histogram(DURATION_BUCKETS), in_flight=Gauge())
    return found


#: Label pairs (project, model) the usage counters keep; past it, new pairs count under ("other", "other").
MAX_USAGE_PAIRS = 1000
OTHER = ("other", "other")
_usage: dict[tuple[str, str], list[int]] = {}  # (project, model) -> [requests, prompt tokens, completion tokens]


def count_usage(project: str, model: str, prompt: int, completion: int) -> None:
    """One metered request of ``project`` for ``model`` (a table name): bounded to ``MAX_USAGE_PAIRS`` pairs."""
    pair = (project, model)
    child = _usage.get(pair)
    if child is None:
        if len(_usage) >= MAX_USAGE_PAIRS:
            pair = OTHER
            child = _usage.get(pair)
        if child is None:
            child = _usage[pair] = [0, 0, 0]
    child[0] += 1
    child[1] += prompt
    child[2] += completion


def count_request(model: str, replica: str, code: int) -> None:
    key = (model, replica, code)
    child = _requests.get(key)
    if child is None:
        child = _requests[key] = [0]
    child[0] += 1


class _Collector:
    """Exposes the plain counters above in ``REGISTRY`` under their metric names."""

    def describe(self) -> list[metrics_core.Metric]:
        return []  # unchecked names: the families below are the registry's only ones of these names

    def collect(self) -> Iterator[metrics_core.Metric]:
        requests = metrics_core.CounterMetricFamily("llmgw_router_requests", REQUESTS_DOC,
                                                    labels=["model", "replica", "code"])
        for (model, replica, code), child in list(_requests.items()):
            requests.add_metric([model, replica, str(code)], child[0])
        yield requests
        used = metrics_core.CounterMetricFamily("llmgw_router_project_requests", USAGE_REQUESTS_DOC,
                                                labels=["project", "model"])
        tokens = metrics_core.CounterMetricFamily("llmgw_router_project_tokens", USAGE_TOKENS_DOC,
                                                  labels=["project", "model", "kind"])
        for (project, model), child in list(_usage.items()):
            used.add_metric([project, model], child[0])
            tokens.add_metric([project, model, "prompt"], child[1])
            tokens.add_metric([project, model, "completion"], child[2])
        yield used
        yield tokens
        all_series = list(_series.items())
        for family, pick in ((TTFT, _ttft), (ITL, _itl), (DURATION, _duration)):
            out = metrics_core.HistogramMetricFamily(family.name, family.doc, labels=["model"])
            for model, found in all_series:
                buckets, total = pick(found).samples()
                out.add_metric([model], buckets, total)
            yield out
        in_flight = metrics_core.GaugeMetricFamily("llmgw_router_requests_in_flight", IN_FLIGHT_DOC,
                                                   labels=["model"])
        for model, found in all_series:
            in_flight.add_metric([model], found.in_flight.value)
        yield in_flight
        overhead = metrics_core.HistogramMetricFamily("llmgw_router_overhead_seconds", OVERHEAD_DOC)
        buckets, total = OVERHEAD.samples()
        overhead.add_metric([], buckets, total)
        yield overhead


def _ttft(found: Series) -> Histogram:
    return found.ttft


def _itl(found: Series) -> Histogram:
    return found.itl


def _duration(found: Series) -> Histogram:
    return found.duration


REGISTRY.register(_Collector())


class Trace:
    """One forwarded request's clock readings and outcome; ``finish()`` records them.

    Times are ``time.perf_counter()`` readings taken by the app and the relay.
    """

    __slots__ = ("model", "series", "arrived", "upstream_at", "own", "status", "replica", "signals", "tokens",
                 "held", "ttft", "meter", "ratelimit")

    def __init__(self, model: str, arrived: float) -> None:
        self.model = model
        self.series = series(model)
        self.arrived = arrived
        self.upstream_at = 0.0  # when the upstream request was handed to the client pool
        self.own = 0.0  # the router's time after the first upstream byte, added by the relay
        self.status = 499  # until a response starts: what nginx counts when the client left first
        self.replica = ""
        self.signals: ModelCounts | None = None  # the model's counters for the autoscaler, when reported
        self.tokens = 0  # output tokens of the answer (the relay's count), for ``signals``
        self.held = False  # held for a model at zero: its first token ends a cold start
        self.ttft = 0.0  # seconds from arrival to the first token (a whole answer: to the answer); 0: none
        self.meter: Metered | None = None  # the request's metering (``metering``), when metered
        #: The answer's x-ratelimit-* headers, made when its start is sent (``router.quota``); None: none to add.
        self.ratelimit: Callable[[], list[tuple[bytes, bytes]]] | None = None

    def sent_upstream(self, now: float) -> None:
        self.upstream_at = now

    def before_upstream(self) -> float:
        """Seconds from arrival to the upstream request (0 before it was sent)."""
        return self.upstream_at - self.arrived if self.upstream_at else 0.0

    def first_chunk(self, received: float, sent: float) -> None:
        self.ttft = sent - self.arrived
        self.series.ttft.observe(self.ttft)
        self.own += sent - received
        if self.signals is not None:
            self.signals.first_token(sent - self.arrived)
        if self.held:
            self.cold_started(sent)

    def cold_started(self, sent: float) -> None:
        """The first token (or whole answer) of a request held for a model at zero went out at ``sent``."""
        self.held = False
        COLD_START.labels(model=self.model).observe(sent - self.arrived)

    def finish(self, now: float) -> None:
        count_request(self.model, self.replica, self.status)
        self.series.duration.observe(now - self.arrived)
        if self.signals is not None:
            self.signals.tokens_out += self.tokens
            if self.status >= 500:
                self.signals.errors += 1
        if self.upstream_at:
            OVERHEAD.observe(self.before_upstream() + self.own)


def render() -> tuple[bytes, str]:
    """The exposition body and its content type."""
    return prom.generate_latest(REGISTRY), prom.CONTENT_TYPE_LATEST
