"""The "Deploy a model" page (``/ui/deploy``): from a catalog entry, a repository id, ``mirror://`` or a path a
node reports, to the memory it needs per engine, where it would land (and each other node's reason), and the
model file, editable, that the editor below applies.

Everything comes from the REST API with the browser's credential: the catalog (``GET /api/v1/catalog``) and the
preview (``POST /api/v1/preview``, an operator's: a viewer sees the API's refusal in its words). The preview is
a form post, not a link, so a page on another site cannot make the control plane read from the hub as the
browser's user. Applying is the spec editor's (``models_page.apply``, ``POST /api/v1/models``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.ui import common

#: The form's fields that are whole numbers, with the API's default when left empty.
_NUMBERS = {"context": 0, "concurrency": 1, "replicas": 1}


def _asked(form: dict[str, str]) -> tuple[dict[str, Any], str]:
    """The preview's body from the form, or why not in words."""
    body: dict[str, Any] = {"source": form.get("source", "").strip(), "engine": form.get("engine", "").strip()}
    if not body["source"]:
        return body, "give a source: a catalog entry's, a Hugging Face repository id (ORG/REPO), mirror://NAME " \
                     "or the path of weights a node reports"
    for key, default in _NUMBERS.items():
        raw = form.get(key, "").strip()
        try:
            body[key] = int(raw) if raw else default
        except ValueError:
            return body, f"{key}: expected a whole number, got {raw!r}"
    return body, ""


async def _render(ui: common.Ui, request: Request, *, asked: dict[str, Any], preview: dict[str, Any] | None = None,
                  error: str = "", status_code: int = 200) -> Response:
    who = await ui.who(request)
    answer, _ = await ui.call(request, "GET", "/api/v1/catalog")
    return ui.page(request, "deploy.html", status_code=status_code, title="Deploy a model", who=who,
                   catalog=answer.doc.get("items", []), catalog_error=answer.error, asked=asked, preview=preview,
                   error=error, text=preview["manifest_yaml"] if preview else "",
                   can_mutate=who[1] not in ("", "viewer"))


async def deploy_form(ui: common.Ui, request: Request) -> Response:
    return await _render(ui, request, asked={"concurrency": 1, "replicas": 1})


async def deploy_preview(ui: common.Ui, request: Request) -> Response:
    """The preview of the form's source (``POST /api/v1/preview``), shown with the model file to apply."""
    body, why = _asked(await common.read_form(request))
    if why:
        return await _render(ui, request, asked=body, error=why, status_code=400)
    answer, _ = await ui.call(request, "POST", "/api/v1/preview", json=body)
    if answer.error:
        return await _render(ui, request, asked=body, error=answer.error, status_code=answer.status)
    return await _render(ui, request, asked=body, preview=answer.doc)


def routes(ui: common.Ui) -> list[Route]:
    return [Route("/deploy", ui.bind(deploy_form), methods=["GET"]),
            Route("/deploy", ui.bind(deploy_preview), methods=["POST"])]
