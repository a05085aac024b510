"""The Audit page (``/ui/audit``): who changed what and when, newest first, a page at a time.

Read from ``GET /api/v1/audit`` (what ``llmgw audit`` reads) with the browser's own credential, so a
viewer sees the API's 403 sentence rather than a rule of the page's own. The API answers oldest first
after an id (``since``/``limit``); the page turns that into newest-first pages: the newest page walks to
the end of the log, an older one asks for the ``limit`` entries before the oldest id shown.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.ui import common

#: Entries a page shows.
PER_PAGE = 100
#: The API's largest ``limit``: the walk to the newest entries takes as few calls as it can.
WALK_LIMIT = 10_000


def _id(text: str | None) -> int:
    """A query's id; anything but a positive whole number is 0 (the newest page)."""
    try:
        return max(0, int(text or "0"))
    except ValueError:
        return 0


async def _newest(ui: common.Ui, request: Request) -> tuple[common.ApiAnswer, list[dict[str, Any]]]:
    """The last PER_PAGE entries, walking the log forward a full API page at a time until it ends."""
    since, kept = 0, list[dict[str, Any]]()
    while True:
        answer, _ = await ui.call(request, "GET", "/api/v1/audit", params={"since": since, "limit": WALK_LIMIT})
        if answer.error:
            return answer, []
        items = list(answer.doc.get("items", []))
        kept = (kept + items)[-PER_PAGE:]
        if len(items) < WALK_LIMIT:
            return answer, kept
        since = max(int(e["id"]) for e in items)


async def _before(ui: common.Ui, request: Request, before: int) -> tuple[common.ApiAnswer, list[dict[str, Any]]]:
    """Up to PER_PAGE entries with ids below ``before`` (ids count up from 1, so these are the ones just older)."""
    answer, _ = await ui.call(request, "GET", "/api/v1/audit",
                              params={"since": max(0, before - 1 - PER_PAGE), "limit": PER_PAGE})
    # Filtered, not trusted: were ids ever skipped the API's page would run on into the newer one shown.
    return answer, [e for e in answer.doc.get("items", []) if int(e["id"]) < before]


async def audit(ui: common.Ui, request: Request) -> Response:
    before = _id(request.query_params.get("before"))
    answer, items = await (_before(ui, request, before) if before else _newest(ui, request))
    rows = list(reversed(items))  # times drawn by the template's ``when`` (relative, UTC on hover)
    oldest = min((int(e["id"]) for e in items), default=0)
    return ui.page(request, "audit.html", status_code=200 if not answer.error else answer.status, title="Audit",
                   who=await ui.who(request), entries=rows, error=answer.error,
                   older=oldest if oldest > 1 else 0, newer=bool(before))


def routes(ui: common.Ui) -> list[Route]:
    """The page's routes below the UI's mount, bound to ``ui``."""
    async def get(request: Request) -> Response:
        return await audit(ui, request)

    return [Route("/audit", get, methods=["GET"])]
