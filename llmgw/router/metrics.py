"""The router's Prometheus metrics: one registry, shared by every module that counts something.

Labels are model and replica ids, never request content, so cardinality is
bounded by the size of the cluster.
"""

from __future__ import annotations

import prometheus_client as prom

REGISTRY = prom.CollectorRegistry()

RETRIES = prom.Counter("llmgw_router_retries_total", "Requests retried on another endpoint before any byte was sent",
                       ["model", "replica"], registry=REGISTRY)
EJECTIONS = prom.Counter("llmgw_router_ejections_total", "Endpoints taken out of rotation after consecutive failures",
                         ["model", "replica"], registry=REGISTRY)


def count_retry(model: str, replica: str) -> None:
    RETRIES.labels(model=model, replica=replica).inc()


def count_ejection(model: str, replica: str) -> None:
    EJECTIONS.labels(model=model, replica=replica).inc()


def render() -> tuple[bytes, str]:
    """The exposition body and its content type."""
    return prom.generate_latest(REGISTRY), prom.CONTENT_TYPE_LATEST
