"""The Projects pages (``/ui/projects``, ``/ui/projects/{name}``): the projects the user may see, and one
project's members, limits and keys, with a link to its usage (``/ui/usage?project=NAME``).

As the Keys page, every action is the REST API's (``/api/v1/projects``) called with the browser's own
credential, so a refusal is the API's sentence: an owner adds members, an operator or admin also
creates projects and sets limits. The controls are left out for those the API would refuse.
"""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.ui import common
from llmgw.core import quota

#: Cluster roles that create projects and set limits.
MANAGERS = ("operator", "admin")


async def _list(ui: common.Ui, request: Request, *, status_code: int = 200, error: str = "",
                form: dict[str, str] | None = None) -> Response:
    answer, _ = await ui.call(request, "GET", "/api/v1/projects")
    who = await ui.who(request)
    items = answer.doc.get("items", [])  # times drawn by the template's ``when`` (relative, UTC on hover)
    return ui.page(request, "projects.html", status_code=status_code, title="Projects", who=who, projects=items,
                   kinds=quota.KINDS, list_error=answer.error, error=error, form=form or {},
                   manager=who[1] in MANAGERS)


async def _describe(ui: common.Ui, request: Request, *, status_code: int = 200, error: str = "") -> Response:
    name = request.path_params["name"]
    quoted = urllib.parse.quote(name, safe="")
    answer, _ = await ui.call(request, "GET", f"/api/v1/projects/{quoted}")
    keys, _ = await ui.call(request, "GET", f"/api/v1/keys?project={quoted}")
    who = await ui.who(request)
    project = answer.doc
    manager = who[1] in MANAGERS
    return ui.page(request, "project.html", status_code=answer.status if answer.error else status_code,
                   title=f"Project {name}", who=who, name=name, project=project, load_error=answer.error,
                   keys=keys.doc.get("items", []), error=error, kinds=quota.KINDS, roles=quota.PROJECT_ROLES,
                   manager=manager, owner=manager or project.get("role") == "owner")


async def _create(ui: common.Ui, request: Request) -> Response:
    form = await common.read_form(request)
    body = {"name": form.get("name", "").strip(), "description": form.get("description", "").strip()}
    answer, _ = await ui.call(request, "POST", "/api/v1/projects", json=body)
    if answer.error:
        return await _list(ui, request, status_code=answer.status, error=answer.error, form=form)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/projects/{answer.doc['name']}", status_code=303)


def _number(text: str) -> int | float | str:
    """A limit field as a number (blank: 0, no limit); text the API refuses by name otherwise."""
    text = text.strip()
    if not text:
        return 0
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


async def _change(ui: common.Ui, request: Request, what: str) -> Response:
    """Members (set, remove) and limits, through the API; back to the project, or its refusal on the page."""
    name = urllib.parse.quote(request.path_params["name"], safe="")
    form = await common.read_form(request)
    if what == "member":
        answer, _ = await ui.call(request, "PUT", f"/api/v1/projects/{name}/members",
                                  json={"user": form.get("user", "").strip(), "role": form.get("role", "")})
    elif what == "remove":
        user = urllib.parse.quote(form.get("user", ""), safe="")
        answer, _ = await ui.call(request, "DELETE", f"/api/v1/projects/{name}/members/{user}")
    else:
        answer, _ = await ui.call(request, "PUT", f"/api/v1/projects/{name}/limits",
                                  json={k: _number(form.get(k, "")) for k in quota.KINDS if k in form})
    if answer.error:
        return await _describe(ui, request, status_code=answer.status, error=answer.error)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/projects/{name}", status_code=303)


def routes(ui: common.Ui) -> list[Route]:
    """The pages' routes below the UI's mount, bound to ``ui``."""
    async def listing(request: Request) -> Response:
        return await _list(ui, request)

    async def create(request: Request) -> Response:
        return await _create(ui, request)

    async def describe(request: Request) -> Response:
        return await _describe(ui, request)

    def changing(what: str) -> Route:
        async def handle(request: Request) -> Response:
            return await _change(ui, request, what)

        return Route(f"/projects/{{name}}/{what}", handle, methods=["POST"])

    return [Route("/projects", listing, methods=["GET"]), Route("/projects", create, methods=["POST"]),
            Route("/projects/{name}", describe, methods=["GET"]),
            *(changing(what) for what in ("member", "remove", "limits"))]
