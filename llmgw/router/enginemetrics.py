"""The engines' own load and token counts, re-exported on the router's ``/metrics`` with model and replica labels.

The router already scrapes every ready engine's ``/metrics`` for its load-aware policies (``loadwatch``, every
1.5 s, never on the request path); what that scrape read is exported here at the router's own scrape, so one
Prometheus job sees every engine, whatever it is (vLLM, SGLang, llama.cpp, the sim), under one set of names:

- ``llmgw_engine_requests_running`` / ``llmgw_engine_requests_waiting``: the engine's running and queued
  requests (vLLM's ``vllm:num_requests_running``/``waiting``, llama.cpp's ``requests_processing``/``deferred``);
- ``llmgw_engine_kv_cache_usage_ratio``: its KV cache's use, 0..1, where the engine says (vLLM's
  ``vllm:kv_cache_usage_perc``; llama.cpp's server has no such gauge);
- ``llmgw_engine_prompt_tokens_total`` / ``llmgw_engine_generation_tokens_total``: its token counters, where it
  has them (``core.engines.Engine.token_metrics``): ``rate()`` of them is the engine's tokens per second.

A replica gone from the table, or whose scrape went stale, is left out. Routers that share engines (the workers of
one hub) export the same values: ``metricsmerge`` takes the largest of ``llmgw_engine_*`` samples, not their sum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import metrics_core
from prometheus_client.registry import Collector

from llmgw.router import metrics
from llmgw.router.loadwatch import EngineLoad

PREFIX = "llmgw_engine_"
#: (model, replica, what its engine's last scrape said), for every replica with a fresh scrape.
Source = Callable[[], Iterable[tuple[str, str, EngineLoad]]]

_GAUGES = (
    ("requests_running", "Requests the engine is running (prefill or decode), as its own metrics say", "running"),
    ("requests_waiting", "Requests queued in the engine, not yet running, as its own metrics say", "waiting"),
    ("kv_cache_usage_ratio", "The engine's KV cache in use, 0 to 1 (engines that report it: vLLM)", "kv_cache_usage"),
)
_COUNTERS = (
    ("prompt_tokens", "Prompt tokens the engine processed, by its own counter", "prompt_tokens"),
    ("generation_tokens", "Tokens the engine generated, by its own counter", "generation_tokens"),
)
LABELS = ["model", "replica"]


class EngineCollector(Collector):
    """Yields the families above from ``source``; no source (a router that forwards nothing yet): none."""

    def __init__(self) -> None:
        self.source: Source | None = None

    def describe(self) -> list[metrics_core.Metric]:
        return []

    def collect(self) -> Iterator[metrics_core.Metric]:
        rows = list(self.source()) if self.source is not None else []
        for name, doc, field in _GAUGES:
            family = metrics_core.GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)
            for model, replica, load in rows:
                value = getattr(load, field)
                if value is not None:
                    family.add_metric([model, replica], float(value))
            yield family
        for name, doc, field in _COUNTERS:
            counter = metrics_core.CounterMetricFamily(PREFIX + name, doc, labels=LABELS)
            for model, replica, load in rows:
                value = getattr(load, field)
                if value is not None:
                    counter.add_metric([model, replica], float(value))
            yield counter


def names() -> tuple[str, ...]:
    """Every sample family this module exports (counters with their ``_total``), for the dashboards' test."""
    return (*(PREFIX + n for n, _, _ in _GAUGES), *(PREFIX + n + "_total" for n, _, _ in _COUNTERS))


#: The one collector in ``metrics.REGISTRY``; the process's forwarder sets its source.
COLLECTOR = EngineCollector()
metrics.REGISTRY.register(COLLECTOR)
