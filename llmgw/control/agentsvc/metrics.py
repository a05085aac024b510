"""How fast the control plane takes in what agents send: one registry, served on ``/metrics``.

A heartbeat's delay from reaching the server to being applied has two parts,
kept apart because they have different causes:

* ``llmgw_heartbeat_handling_seconds``: from the moment the stream's iterator
  yields the message to the service to when the cluster has applied it
  (protobuf to core types, then ``Cluster.node_heartbeat``). The work one
  heartbeat costs: tens of microseconds.
* ``llmgw_event_loop_wait_seconds``: how long a message that reached the
  process at a random moment waits for the event loop before it can be
  yielded at all. gRPC core receives on its own thread, so bytes wait for
  Python's loop, not the network; the loop is held by anything long on it (a
  reconcile pass, a burst of registrations, a garbage collection).

The wait is measured by a probe that sleeps ``LAG_PROBE_S`` and sees how late
it woke (``llmgw_event_loop_lag_seconds``, one observation per wake). That
count alone understates long stalls, since a one-second stall yields one late
wake while two thousand heartbeats arrive during it. So the wait histogram is
weighted by time: each millisecond of wall clock is one virtual arrival, and a
wake ``L`` late adds arrivals that waited ``L``, ``L - 1 ms``, ... 0 (the sleep
before it counts as waits of 0). Its quantiles are those of the wait of a
heartbeat arriving at a uniformly random moment. The sleep itself is taken as
idle, so a stall that began during it is undercounted by up to ``LAG_PROBE_S``.

There is no send time on the wire (heartbeats are not acknowledged), so no
figure here crosses the network; on loopback that part is microseconds.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Iterator
from typing import Any

import prometheus_client as prom
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

REGISTRY = prom.CollectorRegistry()

#: Tens of microseconds when healthy, up to the seconds of a loop held by a slow pass.
BUCKETS = (0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
           0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
LAG_PROBE_S = 0.005
#: One virtual arrival per this much wall clock.
ARRIVAL_S = 0.001

HEARTBEAT_SECONDS = prom.Histogram(
    "llmgw_heartbeat_handling_seconds",
    "A heartbeat, from the agent stream yielding it to the cluster having applied it",
    buckets=BUCKETS, registry=REGISTRY)
LOOP_LAG_SECONDS = prom.Histogram(
    "llmgw_event_loop_lag_seconds",
    f"How much later than asked a {LAG_PROBE_S * 1000:.0f} ms sleep on the server's event loop woke, per wake",
    buckets=BUCKETS, registry=REGISTRY)
MESSAGES = prom.Counter("llmgw_agent_messages_total", "Messages received from agents, by kind", ["kind"],
                        registry=REGISTRY)
REGISTRATIONS = prom.Counter("llmgw_agent_registrations_total", "Agent streams accepted (a Register acked)",
                             registry=REGISTRY)
STANDBY_REFUSALS = prom.Counter("llmgw_agent_standby_refusals_total", "Registers a standby refused, naming the "
                                 "leader", registry=REGISTRY)
GC_SECONDS = prom.Histogram(
    "llmgw_gc_pause_seconds", "Garbage collections by generation: every thread stops for each",
    ["generation"], buckets=BUCKETS, registry=REGISTRY)


class WaitHistogram(Collector):
    """The time-weighted wait (see the module docstring), as a Prometheus histogram of virtual arrivals."""

    def __init__(self) -> None:
        self.counts = [0.0] * (len(BUCKETS) + 1)  # per bucket, not cumulative; the last is +Inf
        self.total_s = 0.0

    def add(self, slept_s: float, lag_s: float) -> None:
        """One probe: ``slept_s`` of waits of 0, then ``lag_s`` of waits falling evenly from ``lag_s`` to 0."""
        self.counts[0] += slept_s / ARRIVAL_S
        lower = 0.0
        for i, bound in enumerate(BUCKETS):
            if lower >= lag_s:
                break
            self.counts[i] += (min(bound, lag_s) - lower) / ARRIVAL_S
            lower = bound
        else:
            self.counts[-1] += (lag_s - lower) / ARRIVAL_S
        self.total_s += lag_s * lag_s / 2 / ARRIVAL_S

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, buckets = 0.0, []
        for bound, count in zip((*BUCKETS, math.inf), self.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
        yield HistogramMetricFamily(
            "llmgw_event_loop_wait_seconds",
            f"The wait for the server's event loop of a message arriving at a random moment: one virtual "
            f"arrival per {ARRIVAL_S * 1000:.0f} ms of wall clock", buckets=buckets, sum_value=self.total_s)


WAIT = WaitHistogram()
REGISTRY.register(WAIT)

GC_CPU_SECONDS = prom.Counter(
    "llmgw_gc_cpu_seconds_total", "CPU time of the thread that ran each garbage collection, by generation: "
    "unlike the pause, not stretched by other processes on the same core", ["generation"], registry=REGISTRY)
_gc_children = [(GC_SECONDS.labels(generation=str(g)), GC_CPU_SECONDS.labels(generation=str(g))) for g in range(3)]
_gc_started = [0.0, 0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0], _gc_started[1] = time.perf_counter(), time.thread_time()
    else:
        pause, cpu = _gc_children[info["generation"]]
        pause.observe(time.perf_counter() - _gc_started[0])
        cpu.inc(time.thread_time() - _gc_started[1])


def watch_gc() -> None:
    """Times every garbage collection from now on (once per process)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


async def watch_loop_lag(*, interval_s: float = LAG_PROBE_S) -> None:
    """Runs until cancelled, observing the event loop's lag every ``interval_s`` (and garbage collections)."""
    watch_gc()
    observe, add = LOOP_LAG_SECONDS.observe, WAIT.add
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(interval_s)
        lag = max(0.0, time.perf_counter() - t0 - interval_s)
        observe(lag)
        add(interval_s, lag)
