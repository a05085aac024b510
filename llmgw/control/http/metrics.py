"""``GET /metrics``: the control plane's Prometheus series, with the in-process router's on the same scrape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import prometheus_client
from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from llmgw.control.cluster import Cluster
from llmgw.control.http.clustermetrics import ClusterCollector
from llmgw.control.routerreports import RouterEvents
from llmgw.control.state import Phase
from llmgw.control.store.offloop import StoreThread


class _StatementsOnLoop(Collector):
    """``llmgw_store_statements_on_loop_total``: SQL run on the event loop's thread (0 unless a call site is wrong)."""

    def __init__(self, db: StoreThread) -> None:
        self.db = db

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("llmgw_store_statements_on_loop", "SQL statements run on the server's event loop "
                                  "thread instead of the store's (each held every stream and request while it ran)",
                                  value=self.db.statements_on_loop)


def router(db: StoreThread, cluster: Cluster, reports: RouterEvents, extra_registries: tuple[Any, ...],
           cert_files: Mapping[str, Path] | None = None) -> APIRouter:
    """``extra_registries`` (the in-process router's) are collected with the control plane's own; ``cert_files``
    (name -> PEM file) are the certificates whose expiry is exported (``clustermetrics``)."""
    api = APIRouter()
    # Collectors without names (the router's registry, _StatementsOnLoop) kept apart, so that a scrape
    # restricted with name[] reaches them: without it the UI's read of the router's series came back empty.
    registry = prometheus_client.CollectorRegistry(support_collectors_without_names=True)
    nodes_gauge = prometheus_client.Gauge("llmgw_nodes_connected", "Connected agents", registry=registry)
    replicas_gauge = prometheus_client.Gauge("llmgw_replicas", "Replicas by phase", ["phase"], registry=registry)
    for extra in extra_registries:
        registry.register(extra)  # a registry is a collector: one scrape gets both
    registry.register(_StatementsOnLoop(db))
    registry.register(reports.registry)
    state = ClusterCollector(cluster, cert_files or {})
    registry.register(state)

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        """Every metric, or with ``name[]=`` (as client_python's own handler) only the samples so named."""
        names = request.query_params.getlist("name[]")
        nodes_gauge.set(sum(1 for n in cluster.nodes.values() if n.connected))
        # Counted only when asked for: the UI's overview reads the router's few series every 2 s, and
        # counting 2,000 replicas each time was most of that read.
        if not names or {"llmgw_replicas", "llmgw_model_replicas", "llmgw_replica_failures"} & set(names):
            counts = {p.value: 0 for p in Phase}
            state.replicas = await db.list_replica_states()
            for r in state.replicas:
                counts[r.phase.value] += 1
            for phase, count in counts.items():
                replicas_gauge.labels(phase=phase).set(count)
        if not names or "llmgw_certificate_expiry_timestamp_seconds" in names:
            state.node_certs = await db.call(db.store.list_node_certs)
        scraped = registry.restricted_registry(names) if names else registry
        return Response(prometheus_client.generate_latest(scraped), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return api
