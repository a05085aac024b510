"""The Users page (``/ui/users``, administrators): list users and roles, create one (its generated
password shown this once), change a role, delete one.

Every action is the REST call ``llmgw user`` makes (``/api/v1/users``), with the browser's own
credential: a non-admin's page is the API's 403 sentence, and the controls are rendered for admins only.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.ui import common

ROLES = ("admin", "operator", "viewer")


async def _render(ui: common.Ui, request: Request, *, status_code: int = 200, error: str = "",
                  created: dict[str, Any] | None = None, form: dict[str, str] | None = None) -> Response:
    answer, _ = await ui.call(request, "GET", "/api/v1/users")
    who = await ui.who(request)
    items = answer.doc.get("items", [])  # times drawn by the template's ``when`` (relative, UTC on hover)
    return ui.page(request, "users.html", status_code=status_code if not answer.error else answer.status,
                   title="Users", who=who, users=items, list_error=answer.error, error=error, created=created,
                   form=form or {}, roles=ROLES, editable=who[1] == "admin" and not answer.error)


async def _after(ui: common.Ui, request: Request, answer: common.ApiAnswer) -> Response:
    """Where a change goes: the page with the API's sentence when refused, the list when done."""
    if answer.error:
        return await _render(ui, request, status_code=answer.status, error=answer.error)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/users", status_code=303)


async def create(ui: common.Ui, request: Request) -> Response:
    form = await common.read_form(request)
    body = {"name": form.get("name", "").strip(), "role": form.get("role", "")}
    answer, _ = await ui.call(request, "POST", "/api/v1/users", json=body)
    if answer.error:
        return await _render(ui, request, status_code=answer.status, error=answer.error, form=form)
    # Rendered, not redirected: the password is in this one answer and no later GET can show it again.
    return await _render(ui, request, status_code=201, created=answer.doc)


async def set_role(ui: common.Ui, request: Request) -> Response:
    form = await common.read_form(request)
    name = urllib.parse.quote(request.path_params["name"], safe="")
    answer, _ = await ui.call(request, "PUT", f"/api/v1/users/{name}", json={"role": form.get("role", "")})
    return await _after(ui, request, answer)


async def delete(ui: common.Ui, request: Request) -> Response:
    name = urllib.parse.quote(request.path_params["name"], safe="")
    answer, _ = await ui.call(request, "DELETE", f"/api/v1/users/{name}")
    return await _after(ui, request, answer)


def routes(ui: common.Ui) -> list[Route]:
    """The page's routes below the UI's mount, bound to ``ui`` (the UI's session guard is in front of all of them)."""
    def bound(handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            return await handler(ui, request)
        return endpoint

    return [Route("/users", bound(lambda u, r: _render(u, r)), methods=["GET"]),
            Route("/users", bound(create), methods=["POST"]),
            Route("/users/{name}/role", bound(set_role), methods=["POST"]),
            Route("/users/{name}/delete", bound(delete), methods=["POST"])]
