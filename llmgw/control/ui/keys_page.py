"""The Keys page (``/ui/keys``): list API keys, create one (its secret shown this once), delete one.

Every action is the REST API's (``/api/v1/keys``) called with the browser's own credential, so a
viewer's refusal is the API's 403 sentence and the page never needs its own permission rules; the
controls are only left out for a viewer so that nobody is offered a button that would be refused.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.auth import credentials
from llmgw.control.ui import app as app_mod

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


async def _render(ui: app_mod.Ui, request: Request, *, status_code: int = 200, error: str = "",
                  created: dict[str, Any] | None = None, form: dict[str, str] | None = None) -> Response:
    answer, _ = await ui.call(request, "GET", "/api/v1/keys")
    if answer.status == 401:
        return ui.to_login(request)
    who = await ui.who(request)
    items = [{**k, "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(float(k.get("created_at", 0))))}
             for k in answer.doc.get("items", [])]
    return ui.page(request, "keys.html", status_code=status_code, title="Keys", who=who, keys=items,
                   list_error=answer.error, error=error, created=created,
                   form=form or {}, editable=who[1] in EDITORS)


async def keys(ui: app_mod.Ui, request: Request) -> Response:
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    return await _render(ui, request)


async def create(ui: app_mod.Ui, request: Request) -> Response:
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    form = await app_mod.read_form(request)
    rpm, rpm_error = _limit(form.get("rpm", ""), "rpm")
    tpm, tpm_error = _limit(form.get("tpm", ""), "tpm")
    if rpm_error or tpm_error:
        return await _render(ui, request, status_code=422, error=rpm_error or tpm_error, form=form)
    body = {"name": form.get("name", "").strip(), "rpm": rpm, "tpm": tpm,
            "models": [m.strip() for m in form.get("models", "").split(",") if m.strip()]}
    answer, _ = await ui.call(request, "POST", "/api/v1/keys", json=body)
    if answer.status == 401:
        return ui.to_login(request)
    if answer.error:
        return await _render(ui, request, status_code=answer.status, error=answer.error, form=form)
    # Rendered, not redirected: the secret is in this one answer and no later GET can show it again.
    return await _render(ui, request, status_code=201, created=answer.doc)


async def delete(ui: app_mod.Ui, request: Request) -> Response:
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    key_id = request.path_params["key_id"]
    answer, _ = await ui.call(request, "DELETE", f"/api/v1/keys/{key_id}")
    if answer.status == 401:
        return ui.to_login(request)
    if answer.error:
        return await _render(ui, request, status_code=answer.status, error=answer.error)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/keys", status_code=303)


def routes(ui: app_mod.Ui) -> list[Route]:
    """The page's routes below the UI's mount, bound to ``ui``."""
    async def get(request: Request) -> Response:
        return await keys(ui, request)

    async def post(request: Request) -> Response:
        return await create(ui, request)

    async def remove(request: Request) -> Response:
        return await delete(ui, request)

    return [Route("/keys", get, methods=["GET"]), Route("/keys", post, methods=["POST"]),
            Route("/keys/{key_id}/delete", remove, methods=["POST"])]
