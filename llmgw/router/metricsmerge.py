"""The router's metrics summed over processes: ``llmgw router --workers N`` and ``llmgw server --router-workers N``.

Each worker pushes the Prometheus text of its ``metrics.REGISTRY`` (``metrics.render()``) to its hub every
``PUSH_INTERVAL_S`` and once at its stop (``metricspush``); the hub keeps the latest per worker (``Snapshots``)
and answers a scrape with one exposition in which every sample with the same name and labels is summed over the
workers: counters, histogram buckets, sums and counts, and gauges (in flight, queued) alike, each family once
with its ``# HELP``/``# TYPE``. A family only some workers have is there with theirs.

- A worker that restarted pushes a snapshot that replaces its old one: its counters start again from 0, so the
  sum goes down once by what the old process had counted (a counter reset to Prometheus's ``rate()``, as when a
  single router restarts).
- A worker that stopped pushing (``STALE_S``) is dropped from the sum, with the same effect.
- The engines' own figures (``llmgw_engine_*``, ``enginemetrics``) are the same engines seen by every worker: the
  largest of their samples is kept, not their sum.
- ``_created`` samples (prometheus_client's counters and histograms have them) are left out: a sum of creation
  times means nothing, and they are optional in the exposition format.

Pure: text (or families) in, text out; no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import prometheus_client as prom
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

#: How often a worker pushes its metrics to its hub.
PUSH_INTERVAL_S = 2.0
#: A worker that pushed nothing for this long is left out of the sum (it is gone).
STALE_S = 30.0
#: The hub's paths: a worker's push (``?router=ID``, the body its ``render()``) and the merged scrape.
PUSH_PATH = "/api/v1/router/metrics"
MERGED_PATH = "/api/v1/router/metrics/merged"

#: Families every worker reads from the same engines (``enginemetrics.PREFIX``): merged by their largest value.
ENGINE_PREFIX = "llmgw_engine_"

_Key = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> list[Metric]:
    """The families of an exposition (``ValueError`` when it is not one)."""
    return list(text_string_to_metric_families(text))


def _created(name: str) -> bool:
    return name.endswith("_created")


def merge(sources: Iterable[Iterable[Metric]]) -> list[Metric]:
    """The families of ``sources`` (one iterable of families per process), samples of the same name and labels summed.

    A family's help and type are the first source's that has it; samples keep their first-seen order, grouped by
    their labels but ``le`` (a histogram's buckets stay together with their count and sum).
    """
    heads: dict[str, Metric] = {}
    sums: dict[str, dict[_Key, float]] = {}
    for families in sources:
        for family in families:
            if family.type == "gauge" and _created(family.name):
                continue  # a counter's or histogram's creation time, as text exposes it
            if family.name not in heads:
                heads[family.name] = family
                sums[family.name] = {}
            into = sums[family.name]
            same_engines = family.name.startswith(ENGINE_PREFIX)
            for sample in family.samples:
                if _created(sample.name):
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = into.get(key)
                if before is None:
                    into[key] = sample.value
                else:
                    into[key] = max(before, sample.value) if same_engines else before + sample.value
    out = []
    for name, head in heads.items():
        made = Metric(name, head.documentation, head.type, head.unit)
        groups: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
        for (sample_name, labels), value in sums[name].items():
            group = tuple(kv for kv in labels if kv[0] != "le")
            groups.setdefault(group, []).append(Sample(sample_name, dict(labels), value))
        made.samples = [s for samples in groups.values() for s in samples]
        out.append(made)
    return out


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: list[Metric]) -> bytes:
    """The exposition text of ``families``."""
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return prom.generate_latest(registry)


def merge_texts(texts: Iterable[str]) -> bytes:
    """Expositions summed into one (``merge``); ``ValueError`` when one is not an exposition."""
    return render(merge(parse(text) for text in texts))


class Snapshots:
    """The latest metrics each worker pushed, by its router id; those older than ``stale_s`` left out."""

    def __init__(self, *, stale_s: float = STALE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_s = stale_s
        self._clock = clock
        self._latest: dict[str, tuple[float, list[Metric]]] = {}

    def put(self, router_id: str, text: str) -> None:
        """``router_id``'s snapshot now (replacing its last); ``ValueError`` when ``text`` is not an exposition."""
        self._latest[router_id] = (self._clock(), parse(text))

    def families(self) -> list[list[Metric]]:
        """Each live worker's families; the stale ones are forgotten."""
        now = self._clock()
        for router_id in [r for r, (at, _) in self._latest.items() if now - at > self._stale_s]:
            del self._latest[router_id]
        return [families for _, families in self._latest.values()]

    def merged(self) -> bytes:
        """The live workers' metrics summed, as exposition text."""
        return render(merge(self.families()))


class Merged(Collector):
    """``registry`` (the in-process router's) collected with ``snapshots`` summed into it: one family per name.

    For a server's ``/metrics`` (``llmgw server --router-workers``): in place of the router's registry.
    """

    def __init__(self, registry: prom.CollectorRegistry, snapshots: Snapshots) -> None:
        self._registry = registry
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        workers = self._snapshots.families()
        if not workers:
            return self._registry.collect()
        return iter(merge([self._registry.collect(), *workers]))
