"""The Usage page (``/ui/usage``): tokens per day per project and per model, requests, TTFT p90, and a table.

Filters come in the query string (``?project=a&model=m&since=30d``), so a link can carry them: the projects
page links a project's usage as ``/ui/usage?project=NAME``. The data is read from ``GET /api/v1/usage`` and
``/api/v1/usage/series`` with the browser's own credential, so a member sees only their projects and a
project they may not read is the API's 404 sentence on the page. Charts are inline SVG drawn here
(``charts``); the page runs no script of its own.

A window of two days or less is drawn per hour, a longer one per UTC day; every bucket of the window gets
its slot, empty ones included, so the days line up across the charts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.ui import charts, common

#: The windows offered (any duration the API takes works in the query string).
SINCE_CHOICES = ("24h", "7d", "30d", "90d")
#: Series a stacked chart draws by name; the rest are summed as "other".
MAX_SERIES = 8
OTHER = "other"
_HOURLY_UP_TO_S = 2 * 86400


def _labels(since: float, until: float, step: int) -> list[int]:
    """Each bucket's start in ``[since, until)``, ``since`` rounded down to the bucket."""
    first = int(since) // step * step
    return list(range(first, int(until), step)) or [first]


def _label(start: int, step: int) -> str:
    return time.strftime("%H:00" if step == 3600 else "%m-%d", time.gmtime(start))


def stacks(rows: Sequence[dict[str, Any]], starts: list[int], field: str) -> dict[str, list[float]]:
    """``field`` per series and bucket: the ``MAX_SERIES`` largest series by name, the others as ``other``."""
    index = {s: i for i, s in enumerate(starts)}
    per: dict[str, list[float]] = {}
    for r in rows:
        i = index.get(int(r["start"]))
        if i is not None:
            per.setdefault(r["series"] or "-", [0.0] * len(starts))[i] += float(r[field])
    ranked = sorted(per, key=lambda s: (-sum(per[s]), s))
    kept = {s: per[s] for s in ranked[:MAX_SERIES]}
    if len(ranked) > MAX_SERIES:
        kept[OTHER] = [sum(per[s][i] for s in ranked[MAX_SERIES:]) for i in range(len(starts))]
    return kept


def _per_bucket(rows: Sequence[dict[str, Any]], starts: list[int], field: str, *,
                missing: float | None = 0.0) -> list[float | None]:
    """``field`` per bucket; ``missing`` where no row is (None for a TTFT: no request is not 0 ms)."""
    values: dict[int, float | None] = dict.fromkeys(starts, missing)
    for r in rows:
        if int(r["start"]) in values and (missing is not None or r["ttft_p90_ms"] > 0):
            values[int(r["start"])] = float(r[field])
    return [values[s] for s in starts]


async def usage(ui: common.Ui, request: Request) -> Response:
    q = request.query_params
    filters = {k: q.get(k, "").strip() for k in ("project", "model")}
    since = q.get("since", "").strip() or "7d"
    common_params = {"since": since, **{k: v for k, v in filters.items() if v}}
    by = "model" if filters["project"] else "project"
    table, _ = await ui.call(request, "GET", "/api/v1/usage", params={**common_params, "by": by})
    ctx: dict[str, Any] = {"filters": filters, "since": since, "since_choices": SINCE_CHOICES, "by": by,
                           "rows": [], "error": table.error, "charts": []}
    status = table.status if table.error else 200
    if not table.error:
        until = float(table.doc["until"])
        step = 3600 if until - float(table.doc["since"]) <= _HOURLY_UP_TO_S else 86400
        bucket = "hour" if step == 3600 else "day"
        starts = _labels(float(table.doc["since"]), until, step)
        labels = [_label(s, step) for s in starts]
        per = "hour" if step == 3600 else "day"
        answers = {}
        for name, extra in (("project", {"by": "project"}), ("model", {"by": "model"}), ("all", {})):
            answer, _ = await ui.call(request, "GET", "/api/v1/usage/series",
                                      params={**common_params, "bucket": bucket, **extra})
            if answer.error:
                ctx["error"], status = answer.error, answer.status
                break
            answers[name] = answer.doc["rows"]
        else:
            total = answers["all"]
            ctx["charts"] = [
                ("tokens-by-project", charts.stacked_bar(labels, stacks(answers["project"], starts, "total_tokens"),
                                                         title=f"Tokens per {per}, by project")),
                ("tokens-by-model", charts.stacked_bar(labels, stacks(answers["model"], starts, "total_tokens"),
                                                       title=f"Tokens per {per}, by model")),
                ("requests", charts.bar([(label, v or 0.0) for label, v in
                                         zip(labels, _per_bucket(total, starts, "requests"), strict=True)],
                                        title=f"Requests per {per}")),
                ("ttft-p90", charts.line(list(zip(labels, _per_bucket(total, starts, "ttft_p90_ms", missing=None),
                                                  strict=True)),
                                         title=f"Time to first token, p90 per {per}", unit=" ms")),
            ]
        ctx["rows"] = table.doc["rows"]
        ctx["window"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(table.doc["since"])))
    title = f"Usage · {filters['project']}" if filters["project"] else "Usage"
    return ui.page(request, "usage.html", status_code=status, title=title, who=await ui.who(request), **ctx)


def routes(ui: common.Ui) -> list[Route]:
    """The page's routes below the UI's mount, bound to ``ui``."""
    return [Route("/usage", ui.bind(usage), methods=["GET"])]
