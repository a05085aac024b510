"""The overview (``/ui/``): nodes, models, recent events and traffic, each part also a live fragment.

Each part is one in-process API call; the page asks for them together, and htmx refreshes each one on
its own (``/ui/fragments/{nodes,models,events,traffic}``). A part the API refuses shows its sentence in
place, and the rest of the page still renders.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.ui import traffic
from llmgw.control.ui.common import ApiAnswer, Ui, api_message
from llmgw.control.ui.nodes_page import Part, nodes

#: Events the overview shows (the newest first), out of the last hour's.
EVENTS_SHOWN = 30


async def models(ui: Ui, request: Request) -> Part:
    answer, _ = await ui.call(request, "GET", "/api/v1/models")
    return answer if answer.error else {"models": answer.doc.get("items", [])}


async def events(ui: Ui, request: Request) -> Part:
    answer, _ = await ui.call(request, "GET", "/api/v1/events",
                              params={"since": time.time() - 3600, "limit": EVENTS_SHOWN})
    if answer.error:
        return answer
    return {"events": list(reversed(answer.doc.get("items", [])[-EVENTS_SHOWN:]))}


async def traffic_part(ui: Ui, request: Request) -> Part:
    # The router's own counters over the API, two series only (``traffic``): never its objects.
    resp = await ui.raw(request, "GET", "/metrics", params=traffic.QUERY)
    if not resp.is_success:
        return ApiAnswer(resp.status_code, {}, api_message(resp))
    return {"report": ui.traffic.add(traffic.parse(resp.text, at=time.monotonic()))}


#: The fragments by name: each is a part of the overview, refreshed on its own.
PARTS: dict[str, Callable[[Ui, Request], Awaitable[Part]]] = {
    "nodes": nodes, "models": models, "events": events, "traffic": traffic_part}


async def overview(ui: Ui, request: Request) -> Response:
    # Together: each waits on the store's thread or a JSON build in a worker, not on the others.
    nodes_now, models_now, events_now, traffic_now, who = await asyncio.gather(
        nodes(ui, request), models(ui, request), events(ui, request), traffic_part(ui, request), ui.who(request))
    parts = {"nodes": nodes_now, "models": models_now, "events": events_now, "traffic": traffic_now}
    ctx = {k: (p if isinstance(p, dict) else {"error": p.error}) for k, p in parts.items()}
    return ui.page(request, "overview.html", title="Overview", who=who, **ctx)


async def fragment(ui: Ui, request: Request) -> Response:
    which = request.path_params["which"]
    get = PARTS.get(which)
    if get is None:
        # Through the template's escaping: the name is the URL's, and a tag in it was sent back as HTML.
        return ui.page(request, "_no_fragment.html", status_code=404, which=which[:40])
    part = await get(ui, request)
    ctx = part if isinstance(part, dict) else {"error": part.error}
    return ui.page(request, f"_{which}.html", **{which: ctx})


def routes(ui: Ui) -> list[Route]:
    """The overview and its fragments, below the UI's mount."""
    return [
        Route("/", ui.bind(overview), methods=["GET"]),
        Route("/fragments/{which}", ui.bind(fragment), methods=["GET"]),
    ]
