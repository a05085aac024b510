"""The router's Prometheus metrics: one registry, shared by every module that counts something.

Labels are model and replica ids, never request content, so cardinality is
bounded by the size of the cluster. A request for a model the table does not
know is counted under ``model=""``: the client's string as a label would let
any client mint series. ``replica=""`` means the router answered itself.

The hot path touches only pre-resolved children: ``series(model)`` returns the
labelled histograms and gauge of one model, resolved once and cached, so a
streamed chunk costs one ``perf_counter()`` and one ``observe``.

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

import dataclasses

import prometheus_client as prom

REGISTRY = prom.CollectorRegistry()

#: A first token: from a fast cache hit to a minute of prefill or waiting.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: The gap between chunks: a few ms on a fast GPU, seconds when the engine is overloaded.
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: A whole request: an embedding in ms, a long generation in many minutes.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                    1800.0)
#: The router's own time: tenths of a millisecond when healthy.
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

RETRIES = prom.Counter("llmgw_router_retries_total", "Requests retried on another endpoint before any byte was sent",
                       ["model", "replica"], registry=REGISTRY)
EJECTIONS = prom.Counter("llmgw_router_ejections_total", "Endpoints taken out of rotation after consecutive failures",
                         ["model", "replica"], registry=REGISTRY)
REQUESTS = prom.Counter("llmgw_router_requests_total",
                        "Requests answered, by model, the replica that answered (empty: the router itself) and "
                        "HTTP status (499: the client left first)", ["model", "replica", "code"], registry=REGISTRY)
TTFT = prom.Histogram("llmgw_router_time_to_first_token_seconds",
                      "Streamed requests: arrival at the router to the first engine chunk sent to the client",
                      ["model"], buckets=TTFT_BUCKETS, registry=REGISTRY)
ITL = prom.Histogram("llmgw_router_inter_token_latency_seconds",
                     "Streamed requests: time between successive chunks relayed to the client",
                     ["model"], buckets=ITL_BUCKETS, registry=REGISTRY)
DURATION = prom.Histogram("llmgw_router_request_duration_seconds",
                          "Arrival at the router to the last byte sent to the client",
                          ["model"], buckets=DURATION_BUCKETS, registry=REGISTRY)
IN_FLIGHT = prom.Gauge("llmgw_router_requests_in_flight", "Requests being forwarded now", ["model"],
                       registry=REGISTRY)
OVERHEAD = prom.Histogram("llmgw_router_overhead_seconds",
                          "The router's own time per request: arrival to the upstream request, plus the first "
                          "upstream byte to the first byte sent to the client", buckets=OVERHEAD_BUCKETS,
                          registry=REGISTRY)
# Always 0 until the admission queue exists (it comes with API keys); see the module docstring.
QUEUED = prom.Gauge("llmgw_router_queued_requests", "Requests waiting in the router's admission queue",
                    registry=REGISTRY)
QUEUE_OLDEST = prom.Gauge("llmgw_router_queue_oldest_seconds", "Age of the oldest request in the admission queue",
                          registry=REGISTRY)


def count_retry(model: str, replica: str) -> None:
    RETRIES.labels(model=model, replica=replica).inc()


def count_ejection(model: str, replica: str) -> None:
    EJECTIONS.labels(model=model, replica=replica).inc()


@dataclasses.dataclass(frozen=True, slots=True)
class Series:
    """One model's pre-resolved children, so the hot path never formats labels."""

    ttft: prom.Histogram
    itl: prom.Histogram
    duration: prom.Histogram
    in_flight: prom.Gauge


_series: dict[str, Series] = {}
_requests: dict[tuple[str, str, int], prom.Counter] = {}


def series(model: str) -> Series:
    """The children for ``model`` (a table name, never a client's string), resolved once."""
    found = _series.get(model)
    if found is None:
        found = _series[model] = Series(ttft=TTFT.labels(model), itl=ITL.labels(model),
                                        duration=DURATION.labels(model), in_flight=IN_FLIGHT.labels(model))
    return found


def count_request(model: str, replica: str, code: int) -> None:
    key = (model, replica, code)
    child = _requests.get(key)
    if child is None:
        child = _requests[key] = REQUESTS.labels(model, replica, str(code))
    child.inc()


class Trace:
    """One forwarded request's clock readings and outcome; ``finish()`` records them.

    Times are ``time.perf_counter()`` readings taken by the app and the relay.
    """

    __slots__ = ("model", "series", "arrived", "upstream_at", "own", "status", "replica")

    def __init__(self, model: str, arrived: float) -> None:
        self.model = model
        self.series = series(model)
        self.arrived = arrived
        self.upstream_at = 0.0  # when the upstream request was handed to the client pool
        self.own = 0.0  # the router's time after the first upstream byte, added by the relay
        self.status = 499  # until a response starts: what nginx counts when the client left first
        self.replica = ""

    def sent_upstream(self, now: float) -> None:
        self.upstream_at = now

    def before_upstream(self) -> float:
        """Seconds from arrival to the upstream request (0 before it was sent)."""
        return self.upstream_at - self.arrived if self.upstream_at else 0.0

    def first_chunk(self, received: float, sent: float) -> None:
        self.series.ttft.observe(sent - self.arrived)
        self.own += sent - received

    def finish(self, now: float) -> None:
        count_request(self.model, self.replica, self.status)
        self.series.duration.observe(now - self.arrived)
        if self.upstream_at:
            OVERHEAD.observe(self.before_upstream() + self.own)


def render() -> tuple[bytes, str]:
    """The exposition body and its content type."""
    return prom.generate_latest(REGISTRY), prom.CONTENT_TYPE_LATEST
