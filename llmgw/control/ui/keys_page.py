"""The Keys page (``/ui/keys``): list API keys with when each was last used, create one (its secret shown
this once, with a copy button), scoped to models and limited; disable, enable or delete one.

Every action is the REST API's (``/api/v1/keys``) called with the browser's own credential, so a
viewer's refusal is the API's 403 sentence and the page never needs its own permission rules; the
controls are only left out for a viewer in no project (as owner or member) so that nobody is offered
a button that would be refused. The list is what the API lets the caller see (issue 26: an owner its
projects' keys, a member its own), each with its project and user.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.ui import common

#: Roles whose keys page carries the create and delete controls (the API lets operators change keys).
EDITORS = ("operator", "admin")


def _limit(text: str, field: str) -> tuple[int, str]:
    """A form's rpm/tpm as an integer (blank is 0, unlimited), or the sentence saying what is wrong."""
    text = text.strip()
    if not text:
        return 0, ""
    try:
        return int(text), ""
    except ValueError:
        return 0, f"{field} must be a whole number of requests or tokens a minute (0 or blank: unlimited), not {text!r}"


def _priority(text: str) -> tuple[int, str]:
    """The form's priority (blank is 0), or the sentence saying what is wrong."""
    text = text.strip()
    try:
        return (int(text) if text else 0), ""
    except ValueError:
        return 0, f"priority must be a whole number from -1000 to 1000 (higher is admitted first), not {text!r}"


async def _render(ui: common.Ui, request: Request, *, status_code: int = 200, error: str = "",
                  created: dict[str, Any] | None = None, form: dict[str, str] | None = None) -> Response:
    answer, _ = await ui.call(request, "GET", "/api/v1/keys")
    projects, _ = await ui.call(request, "GET", "/api/v1/projects")
    who = await ui.who(request)
    # The projects a key may be made in: every one for an operator, an owner's or member's own for others.
    makes_in = [p["name"] for p in projects.doc.get("items", [])
                if who[1] in EDITORS or p.get("role") in ("owner", "member")]
    items = answer.doc.get("items", [])  # times drawn by the template's ``when`` (relative, UTC on hover)
    return ui.page(request, "keys.html", status_code=status_code, title="Keys", who=who, keys=items,
                   list_error=answer.error, error=error, created=created,
                   form=form or {}, editable=who[1] in EDITORS or bool(makes_in), projects=makes_in)


async def keys(ui: common.Ui, request: Request) -> Response:
    return await _render(ui, request)


async def create(ui: common.Ui, request: Request) -> Response:
    form = await common.read_form(request)
    rpm, rpm_error = _limit(form.get("rpm", ""), "rpm")
    tpm, tpm_error = _limit(form.get("tpm", ""), "tpm")
    priority, priority_error = _priority(form.get("priority", ""))
    if rpm_error or tpm_error or priority_error:
        return await _render(ui, request, status_code=422, error=rpm_error or tpm_error or priority_error, form=form)
    body = {"name": form.get("name", "").strip(), "rpm": rpm, "tpm": tpm, "priority": priority,
            "models": [m.strip() for m in form.get("models", "").split(",") if m.strip()],
            "project": form.get("project", "").strip() or "default", "user": form.get("user", "").strip()}
    answer, _ = await ui.call(request, "POST", "/api/v1/keys", json=body)
    if answer.error:
        return await _render(ui, request, status_code=answer.status, error=answer.error, form=form)
    # Rendered, not redirected: the secret is in this one answer and no later GET can show it again.
    return await _render(ui, request, status_code=201, created=answer.doc)


async def change(ui: common.Ui, request: Request, action: str) -> Response:
    """Deletes, disables or enables the path's key through the API, then back to the list (or its refusal)."""
    key_id = urllib.parse.quote(request.path_params["key_id"], safe="")
    if action == "delete":
        answer, _ = await ui.call(request, "DELETE", f"/api/v1/keys/{key_id}")
    else:
        answer, _ = await ui.call(request, "POST", f"/api/v1/keys/{key_id}/{action}")
    if answer.error:
        return await _render(ui, request, status_code=answer.status, error=answer.error)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/keys", status_code=303)


def routes(ui: common.Ui) -> list[Route]:
    """The page's routes below the UI's mount, bound to ``ui``."""
    async def get(request: Request) -> Response:
        return await keys(ui, request)

    async def post(request: Request) -> Response:
        return await create(ui, request)

    def changing(action: str) -> Route:
        async def handle(request: Request) -> Response:
            return await change(ui, request, action)

        return Route(f"/keys/{{key_id}}/{action}", handle, methods=["POST"])

    return [Route("/keys", get, methods=["GET"]), Route("/keys", post, methods=["POST"]),
            *(changing(action) for action in ("delete", "disable", "enable"))]
