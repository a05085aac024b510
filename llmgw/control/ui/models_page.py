"""The model page (``/ui/models/{name}``): spec as YAML, replicas and events live, scale and delete.

Everything comes from the REST API with the browser's credential (``Ui.call``): the page reads
``/api/v1/models/{name}/describe`` (what ``llmgw describe model`` reads), scaling PUTs the spec back
with ``replicas`` changed (what ``llmgw apply`` sends), delete is the API's DELETE. The UI decides
nothing about permissions beyond hiding controls from a viewer: a viewer who posts anyway gets the
API's 403 sentence on the page.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.auth import credentials
from llmgw.control.ui import app as app_mod
from llmgw.core import specs


def _api_path(name: str) -> str:
    return f"/api/v1/models/{urllib.parse.quote(name, safe='')}"


async def _describe(ui: app_mod.Ui, request: Request, name: str) -> app_mod.ApiAnswer:
    answer, _ = await ui.call(request, "GET", f"{_api_path(name)}/describe")
    return answer


def _ctx(answer: app_mod.ApiAnswer) -> dict[str, Any]:
    if answer.error:
        return {"error": answer.error}
    doc = answer.doc
    return {"doc": doc, "spec_yaml": yaml.safe_dump(doc.get("spec", {}), sort_keys=False),
            "events": list(reversed(doc.get("events", [])))}


async def _render(ui: app_mod.Ui, request: Request, name: str, *, error: str = "", status_code: int = 200) -> Response:
    answer = await _describe(ui, request, name)
    if answer.status == 401:
        return ui.to_login(request)
    who = await ui.who(request)
    return ui.page(request, "model.html", status_code=answer.status if answer.error else status_code,
                   title=f"Model {name}", who=who, name=name, action_error=error,
                   can_mutate=who[1] not in ("", "viewer"), model=_ctx(answer))


async def model_page(ui: app_mod.Ui, request: Request) -> Response:
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    return await _render(ui, request, request.path_params["name"])


async def model_live(ui: app_mod.Ui, request: Request) -> Response:
    """The refreshing part (status, replicas, events, spec), for htmx every 2 s."""
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    name = request.path_params["name"]
    answer = await _describe(ui, request, name)
    if answer.status == 401:
        return ui.to_login(request)
    return ui.page(request, "_model_live.html", name=name, model=_ctx(answer))


async def scale(ui: app_mod.Ui, request: Request) -> Response:
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    name = request.path_params["name"]
    form = await app_mod.read_form(request)
    try:
        delta = int(form.get("delta", ""))
    except ValueError:
        delta = 0
    if delta not in (-1, 1):
        return await _render(ui, request, name, status_code=400,
                             error="scale takes delta -1 or 1 (the − and + buttons send one of them)")
    current = await _describe(ui, request, name)
    if current.status == 401:
        return ui.to_login(request)
    if current.error:
        return await _render(ui, request, name, error=current.error, status_code=current.status)
    spec = dict(current.doc["spec"])
    spec["replicas"] = int(spec.get("replicas", 0)) + delta
    manifest = {"apiVersion": specs.API_VERSION, "kind": "Model", "metadata": {"name": name}, "spec": spec}
    answer, _ = await ui.call(request, "PUT", _api_path(name), json=manifest)
    if answer.error:
        return await _render(ui, request, name, error=answer.error, status_code=answer.status)
    base = request.scope.get("root_path", "")
    return RedirectResponse(f"{base}/models/{urllib.parse.quote(name, safe='')}", status_code=303)


async def delete(ui: app_mod.Ui, request: Request) -> Response:
    if not request.cookies.get(credentials.SESSION_COOKIE):
        return ui.to_login(request)
    name = request.path_params["name"]
    answer, _ = await ui.call(request, "DELETE", _api_path(name))
    if answer.status == 401:
        return ui.to_login(request)
    if answer.error:
        return await _render(ui, request, name, error=answer.error, status_code=answer.status)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)


def routes(ui: app_mod.Ui) -> list[Route]:
    """The model page's routes, below the UI's mount."""

    def bind(handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            return await handler(ui, request)
        return endpoint

    return [
        Route("/models/{name}", bind(model_page), methods=["GET"]),
        Route("/models/{name}/live", bind(model_live), methods=["GET"]),
        Route("/models/{name}/scale", bind(scale), methods=["POST"]),
        Route("/models/{name}/delete", bind(delete), methods=["POST"]),
    ]
