"""The admission queue by class and project on ``/metrics`` (issue 32): depth per class, wait per class and project.

Only a request that queued touches them (one admitted at once never does, so they cost nothing while no queue
forms): ``llmgw_router_queue_wait_seconds`` is the wait of the requests that queued, ``_count`` how many did.

Cardinality is bounded: classes by the cluster's list (at most ``core.queueclasses.MAX_CLASSES``), projects by
``MAX_PROJECTS`` names per router process, after which a new project is counted as ``project="other"``.
"""

from __future__ import annotations

import prometheus_client as prom

from llmgw.router.metrics import REGISTRY

#: Distinct project labels one router process gives before it says "other".
MAX_PROJECTS = 100
#: A queue wait: from a slot freed at once to the admission wait's limit (30 s by default, up to minutes).
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

QUEUED_BY_CLASS = prom.Gauge("llmgw_router_queued_requests_by_class",
                             "Requests waiting in the router's admission queue, by priority class",
                             ["class"], registry=REGISTRY)
QUEUE_WAIT = prom.Histogram("llmgw_router_queue_wait_seconds",
                            "How long requests that queued waited for a model's slot, by priority class and project "
                            f"(past {MAX_PROJECTS} projects: project=\"other\")",
                            ["class", "project"], buckets=WAIT_BUCKETS, registry=REGISTRY)

# The labelled children, resolved once: ``labels()`` takes a lock and checks its arguments each call (~1 us),
# and a waiter touches them three times. Bounded as the labels are.
_depth: dict[str, prom.metrics.Gauge] = {}
_waits: dict[tuple[str, str], prom.metrics.Histogram] = {}
_named: set[str] = set()


def project_label(project: str) -> str:
    """``project``, or "other" once ``MAX_PROJECTS`` others have been named."""
    if project in _named:
        return project
    if len(_named) >= MAX_PROJECTS:
        return "other"
    _named.add(project)
    return project


def _gauge(klass: str) -> prom.metrics.Gauge:
    child = _depth.get(klass)
    if child is None:
        child = _depth[klass] = QUEUED_BY_CLASS.labels(klass)
    return child


def queued(klass: str) -> None:
    _gauge(klass).inc()


def left(klass: str) -> None:
    _gauge(klass).dec()


def waited(klass: str, project: str, seconds: float) -> None:
    label = project_label(project)
    child = _waits.get((klass, label))
    if child is None:
        child = _waits[(klass, label)] = QUEUE_WAIT.labels(klass, label)
    child.observe(seconds)
