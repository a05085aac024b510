"""``GET /api/v1/usage`` and ``GET /api/v1/usage/series``: metered usage, summed, for the CLI, the UI and scripts.

Who sees what: a cluster operator or admin (and ``--insecure``) every project; any other user only the
projects they have a role in (``project_members``). A request naming a project the caller cannot see is
404 with the same sentence whether the project exists or not, so a member of A learns nothing of B.

``since``/``until`` take a duration back from now (``90m``, ``24h``, ``7d``, ``4w``) or a UTC date or time
(``2026-12-01``, ``2026-12-01T10:00:00Z``); the window is read at the grain ``store.usagequery`` picks,
``since`` rounded down to that grain's bucket, and the answer says both.
"""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

from fastapi import APIRouter, Request

from llmgw.control.auth import principals
from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound, Unprocessable
from llmgw.control.store import usagequery
from llmgw.control.store.offloop import StoreThread

_AGO = re.compile(r"^(\d{1,7})([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: The groupings ``by`` takes (``day`` and ``hour`` are time buckets, oldest first).
BY = usagequery.DIMENSIONS
#: What a series is drawn per, besides time.
SERIES_BY = ("project", "key", "model", "user", "node")
_WHEN_HINT = "a duration back from now (90m, 24h, 7d, 4w) or a UTC date or time (2026-12-01, 2026-12-01T10:00:00Z)"


class UsageRowDoc(schemas.Body):
    group: str
    start: int | None
    series: str
    requests: int
    errors: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int
    spend: schemas.Number
    ttft_p50_ms: schemas.Number
    ttft_p90_ms: schemas.Number
    duration_ms_mean: schemas.Number


class UsageDoc(schemas.Body):
    since: int
    until: schemas.Number
    grain: str
    by: str
    rows: list[UsageRowDoc]


def when(text: str, param: str, *, now: float) -> float:
    """``text`` as a UTC epoch second: a duration back from ``now`` or an ISO date/time (UTC unless it says)."""
    m = _AGO.match(text.strip())
    if m:
        return now - int(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        at = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Unprocessable(f"query parameter {param}: {text[:40]!r} is not a time; give {_WHEN_HINT}",
                            code="invalid_time", param=param) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    return at.timestamp()


def _window(since: str, until: str) -> tuple[float, float]:
    now = time.time()
    start = when(since, "since", now=now)
    end = when(until, "until", now=now) if until.strip() else now
    if end <= start:
        raise Unprocessable(f"query parameter until: {until[:40]!r} is not after since ({since[:40]!r}), so the "
                            "window is empty; give an earlier since or a later until", code="invalid_time",
                            param="until")
    return start, end


def _choice(value: str, allowed: tuple[str, ...], param: str) -> str:
    if value not in allowed:
        raise Unprocessable(f"query parameter {param}: {value[:40]!r} is not one of {', '.join(allowed)}",
                            code=f"invalid_{param}", param=param)
    return value


async def visible(db: StoreThread, request: Request, project: str) -> set[str] | None:
    """The projects the caller may read (None: all); 404 when ``project`` is named and not among them."""
    who: principals.Principal | None = request.scope.get(PRINCIPAL)
    if who is None or who.kind == "insecure" or who.role in (principals.OPERATOR, principals.ADMIN):
        return None
    mine = await db.call(db.store.projects_of, who.name) if who.kind == "user" else set()
    if project and project not in mine:
        raise NotFound("project", project, "it does not exist or you are not a member of it; `llmgw project "
                       "list` lists yours", says="is not visible")
    return mine


def row_doc(u: usagequery.UsageRow) -> dict[str, Any]:
    return {"group": u.group, "start": u.start, "series": u.series, "requests": u.requests, "errors": u.errors,
            "prompt_tokens": u.prompt_tokens, "cached_tokens": u.cached_tokens,
            "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens, "spend": u.spend,
            "ttft_p50_ms": u.ttft_p50_ms, "ttft_p90_ms": u.ttft_p90_ms, "duration_ms_mean": u.duration_ms_mean}


def view_doc(v: usagequery.UsageView, by: str) -> dict[str, Any]:
    return {"since": v.since, "until": v.until, "grain": v.grain, "by": by, "rows": [row_doc(u) for u in v.rows]}


def router(db: StoreThread) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/usage", response_model=UsageDoc)
    async def usage(request: Request, since: str = "7d", until: str = "", by: str = "project", project: str = "",
                    key: str = "", model: str = "") -> dict[str, Any]:
        """Usage in the window summed per ``by`` (project, key, model, user, node, day or hour): requests,
        errors, tokens, spend, TTFT p50/p90 and mean duration; only the projects the caller may read."""
        start, end = _window(since, until)
        _choice(by, BY, "by")
        projects = await visible(db, request, project)
        v = await db.call(db.store.usage, start, end, by, project=project, key=key, model=model,
                          projects_visible=projects)
        return view_doc(v, by)

    @api.get("/api/v1/usage/series", response_model=UsageDoc)
    async def series(request: Request, since: str = "7d", until: str = "", bucket: str = "day", by: str = "",
                     project: str = "", key: str = "", model: str = "") -> dict[str, Any]:
        """Usage per time ``bucket`` (day or hour), and per ``by`` when given (each row's ``series``): what
        the UI's charts draw."""
        start, end = _window(since, until)
        _choice(bucket, ("day", "hour"), "bucket")
        if by:
            _choice(by, SERIES_BY, "by")
        projects = await visible(db, request, project)
        v = await db.call(db.store.time_series, start, end, bucket, by, project=project, key=key, model=model,
                          projects_visible=projects)
        return view_doc(v, bucket)

    return api
