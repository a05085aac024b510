"""``GET /api/v1/metrics/history``: a model's or node's recent history, as the UI's charts draw it (issue 30).

What the leader recorded (``control.history``: routers' load reports, agents' heartbeats, the loop's samples),
read over a window: the buckets' start times and, per chart, its lines with a value per bucket (null: a
gap, nothing was heard then). A viewer's read, like the model and node pages'. A standby forwards it to
the leader (``forward``), since only the leader hears the reports.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query

from llmgw.control import history
from llmgw.control.cluster import Cluster
from llmgw.control.http.schemas import HistoryChart, HistoryDoc, HistoryLine, HistoryWindow


def to_doc(scope: history.Scope, name: str, window: HistoryWindow, view: history.View | None) -> HistoryDoc:
    if view is None:
        return HistoryDoc(scope=scope, name=name, window=window, step_s=0, recorded=False, times=[], charts=[])
    return HistoryDoc(scope=scope, name=name, window=window, step_s=view.step_s, recorded=True,
                      times=list(view.times),
                      charts=[HistoryChart(title=c.title, unit=c.unit,
                                           lines=[HistoryLine(name=ln.name, unit=ln.unit, values=list(ln.values))
                                                  for ln in c.lines]) for c in view.charts])


def router(cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/metrics/history", response_model=HistoryDoc)
    async def metrics_history(scope: Literal["model", "node"] = Query(description="a model's or a node's"),
                              name: str = Query(min_length=1, max_length=253, description="the model or node"),
                              window: HistoryWindow = Query(default="1h")) -> HistoryDoc:
        """A model's (requests, errors, TTFT, tokens, queue, replicas) or a node's (CPU, memory, disk, GPU
        memory) history over ``window``, as the leader recorded it; kept in its memory only."""
        view = cluster.history.view(scope, name, history.WINDOWS[window], cluster.clock())
        return to_doc(scope, name, window, view)

    return api
