"""The history charts' fragments (issue 30): ``/ui/charts/{model,node}/{name}`` and ``/ui/charts/overview``.

Each reads ``GET /api/v1/metrics/history`` in process with the browser's credential (``common.Ui``), so a
viewer sees what a viewer's API call shows and a standby's UI reads the leader's history through the
API's forwarding; each draws ``timecharts.time_series`` SVGs, and the pages refresh them with htmx every
``REFRESH_S`` (a bucket is 10 s: faster would redraw the same picture). ``?window=`` picks 5m…24h.

The overview draws one chart per signal with a line per model (requests/s, TTFT p90) or per node (CPU,
memory used, GPU memory used, GPU utilisation), for at most ``OVERVIEW_MAX`` of each.
"""

from __future__ import annotations

import asyncio
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.history import WINDOWS
from llmgw.control.ui import common, timecharts

REFRESH_S = 5
OVERVIEW_MAX = 8
DEFAULT_WINDOW = "1h"


def window_of(request: Request) -> str:
    w = request.query_params.get("window", DEFAULT_WINDOW)
    return w if w in WINDOWS else DEFAULT_WINDOW


async def history(ui: common.Ui, request: Request, scope: str, name: str, window: str) -> common.ApiAnswer:
    answer, _ = await ui.call(request, "GET", "/api/v1/metrics/history",
                              params={"scope": scope, "name": name, "window": window})
    return answer


def draw(doc: dict[str, Any], prefix: str) -> list[Markup]:
    """Every chart of one history document, as SVG."""
    times = doc.get("times", [])
    step = float(doc.get("step_s") or 10)
    out = []
    for i, chart in enumerate(doc.get("charts", [])):
        lines = [(ln["name"], ln["values"]) for ln in chart.get("lines", [])]
        out.append(timecharts.time_series(times, lines, title=chart["title"], unit=chart.get("unit", ""),
                                          step_s=step, chart_id=f"{prefix}-{i}"))
    return out


async def subject(ui: common.Ui, request: Request) -> Response:
    scope, name = request.path_params["scope"], request.path_params["name"]
    window = window_of(request)
    if scope not in ("model", "node"):
        return ui.page(request, "_charts.html", status_code=404, error=f"no charts for {scope[:20]!r}", charts=[])
    answer = await history(ui, request, scope, name, window)
    return ui.page(request, "_charts.html", error=answer.error, window=window, recorded=answer.doc.get("recorded"),
                   charts=draw(answer.doc, f"chart-{scope}") if not answer.error else [])


def _line(doc: dict[str, Any], title: str, line: str) -> list[float | None] | None:
    for chart in doc.get("charts", []):
        if chart["title"] == title:
            for ln in chart["lines"]:
                if ln["name"] == line:
                    return list(ln["values"])
    return None


def _gpu_total(doc: dict[str, Any]) -> list[float | None] | None:
    """A node's GPU memory used, summed over its GPUs (None where none reported)."""
    lines = [ln["values"] for c in doc.get("charts", []) if c["title"] == "GPU memory" for ln in c["lines"]]
    if not lines:
        return None
    return [None if any(v is None for v in col) else sum(col) for col in zip(*lines, strict=True)]


def _gpu_util_mean(doc: dict[str, Any]) -> list[float | None] | None:
    """A node's GPU utilisation, averaged over the GPUs that reported it (None where none did)."""
    lines = [ln["values"] for c in doc.get("charts", []) if c["title"] == "GPU utilisation" for ln in c["lines"]]
    if not lines:
        return None
    cols = ([v for v in col if v is not None] for col in zip(*lines, strict=True))
    return [sum(known) / len(known) if known else None for known in cols]


async def overview_charts(ui: common.Ui, request: Request, window: str) -> dict[str, Any]:
    """The overview's charts: a line per model or node; the names come from the model and node lists."""
    models, _ = await ui.call(request, "GET", "/api/v1/models")
    nodes, _ = await ui.call(request, "GET", "/api/v1/nodes", params={"limit": OVERVIEW_MAX})
    if models.error or nodes.error:
        return {"error": models.error or nodes.error, "charts": []}
    model_names = [m["metadata"]["name"] for m in models.doc.get("items", [])][:OVERVIEW_MAX]
    node_names = [n.get("id") or n.get("name") for n in nodes.doc.get("items", [])][:OVERVIEW_MAX]
    docs = await asyncio.gather(*(history(ui, request, "model", n, window) for n in model_names),
                                *(history(ui, request, "node", n, window) for n in node_names))
    mdocs = [(n, a.doc) for n, a in zip(model_names, docs[:len(model_names)], strict=True) if a.doc.get("recorded")]
    ndocs = [(n, a.doc) for n, a in zip(node_names, docs[len(model_names):], strict=True) if a.doc.get("recorded")]
    times = (mdocs or ndocs or [("", {})])[0][1].get("times", [])
    step = float((mdocs or ndocs or [("", {"step_s": 10})])[0][1].get("step_s") or 10)
    specs = [("Requests by model", "/s", [(n, _line(d, "Requests", "requests")) for n, d in mdocs], "ov-requests"),
             ("Time to first token p90 by model", " ms",
              [(n, _line(d, "Time to first token", "p90")) for n, d in mdocs], "ov-ttft"),
             ("Tokens out by model", "/s", [(n, _line(d, "Tokens", "out")) for n, d in mdocs], "ov-tokens"),
             ("CPU by node", "%", [(n, _line(d, "CPU", "cpu")) for n, d in ndocs], "ov-cpu"),
             ("Memory used by node", "B", [(n, _line(d, "Memory used", "memory")) for n, d in ndocs], "ov-memory"),
             ("GPU memory used by node", "B", [(n, _gpu_total(d)) for n, d in ndocs], "ov-gpu"),
             ("GPU utilisation by node (mean of its GPUs)", "%", [(n, _gpu_util_mean(d)) for n, d in ndocs],
              "ov-gpu-util")]
    charts = []
    for title, unit, lines, ident in specs:
        drawn = [(n, v) for n, v in lines if v is not None and len(v) == len(times)]
        if ident == "ov-gpu" and not drawn:
            continue  # no GPU anywhere: no empty chart for it
        if ident == "ov-gpu-util" and not any(v is not None for _, vs in drawn for v in vs):
            continue  # no GPU says how busy it is (older agents, vGPU): no chart of gaps
        charts.append(timecharts.time_series(times, drawn, title=title, unit=unit, step_s=step, chart_id=ident))
    return {"error": "", "charts": charts}


async def overview(ui: common.Ui, request: Request) -> Response:
    window = window_of(request)
    part = await overview_charts(ui, request, window)
    return ui.page(request, "_charts.html", window=window, recorded=True, **part)


def routes(ui: common.Ui) -> list[Route]:
    return [
        Route("/charts/overview", ui.bind(overview), methods=["GET"]),
        Route("/charts/{scope}/{name}", ui.bind(subject), methods=["GET"]),
    ]
