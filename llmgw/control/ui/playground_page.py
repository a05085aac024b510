"""The Playground (``/ui/playground``): chat with a Ready model through the server's own OpenAI endpoint.

The page lists the Ready models from the REST API (``/api/v1/models``, with the browser's credential);
the chat itself is sent by the browser to ``/v1/chat/completions`` on the same origin, streamed, exactly as
any OpenAI client's request would be, so what the playground shows (tokens, TTFT, tokens/s, refusals) is what
a client meets, and the ``curl`` and Python snippets it shows are the request it sent. The scripts, all in
``static/`` (the CSP allows no inline script): ``playground.js`` (the conversation, its parameters, Stop,
compare, kept in the tab's sessionStorage), ``markdown.js`` (answers rendered by building DOM nodes, never as
HTML), ``snippets.js`` (the request as curl and Python), ``playground_embed.js`` (the tabs, the embeddings).

No key is ever filled in by the server: when the cluster requires keys the user pastes one; it is sent only
as the chat requests' ``Authorization`` header (with ``credentials: "omit"``, so the session cookie never
goes to ``/v1``), kept in the page's memory only and never written into storage or a snippet.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.ui import common
from llmgw.core import engines

#: The UI's mount below the server's root; the OpenAI API lives at the root (``/v1``), not below it.
UI_MOUNT = "/ui"


def ready_models(items: list[dict[str, Any]]) -> list[str]:
    """Names of the models that can answer now: state Ready, or at least one replica Ready (a rollout)."""
    names = []
    for m in items:
        status = m.get("status") or {}
        if status.get("state") == "Ready" or int(status.get("ready_replicas") or 0) > 0:
            names.append(str((m.get("metadata") or {}).get("name", "")))
    return sorted(n for n in names if n)


def embedding_models(items: list[dict[str, Any]]) -> list[str]:
    """The Ready models the embeddings tab lists: all but those whose spec says they do not embed (a llama.cpp
    model without ``--embeddings``, ``core.engines.embeds``), which would only answer with a refusal."""
    ready = set(ready_models(items))
    names = []
    for m in items:
        name = str((m.get("metadata") or {}).get("name", ""))
        spec = m.get("spec") or {}
        args = spec.get("engine_args") or []
        args = [str(a) for a in args] if isinstance(args, list) else []
        if name in ready and engines.embeds(str(spec.get("engine", "")), args) is not False:
            names.append(name)
    return sorted(names)


async def playground(ui: common.Ui, request: Request) -> Response:
    answer, _ = await ui.call(request, "GET", "/api/v1/models")
    base = request.scope.get("root_path", "")
    api_root = base[:-len(UI_MOUNT)] if base.endswith(UI_MOUNT) else ""
    items = list(answer.doc.get("items", []))
    return ui.page(request, "playground.html", title="Playground", who=await ui.who(request),
                   models=ready_models(items), embed_models=embedding_models(items), list_error=answer.error,
                   api_root=api_root)


def routes(ui: common.Ui) -> list[Route]:
    """The page's routes below the UI's mount, bound to ``ui``."""
    async def get(request: Request) -> Response:
        return await playground(ui, request)

    return [Route("/playground", get, methods=["GET"])]
