"""The node pages: ``/ui/nodes`` (every node, 100 a page) and ``/ui/nodes/{id}`` (inventory, shards, load, log).

Everything comes from the REST API with the browser's credential (``Ui.call``): the node page reads
``/api/v1/nodes/{id}/describe`` (what ``llmgw describe node`` reads) and ``/api/v1/nodes/{id}``, the node's
entry of the list (disks, weights, adapters, NVLink and load, which describe leaves out); cordon,
uncordon and drain are the POSTs ``llmgw cordon|uncordon|drain`` make; the agent's log is
``/api/v1/nodes/{id}/logs`` (what ``llmgw logs NODE`` reads), its last lines polled every 2 s by htmx.
A viewer sees no control; one who posts anyway gets the API's 403 sentence on the page.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.ui import common

#: The agent log's lines shown (the newest); what `llmgw logs NODE -n 200` prints.
LOG_LINES = 200
ACTIONS = ("cordon", "uncordon", "drain")
#: Node rows a page: a cluster of 1,000 nodes is ten pages, never a truncated table.
NODES_PER_PAGE = 100

#: A part of a page: its data, or the API's answer when it refused.
Part = common.ApiAnswer | dict[str, Any]


def _api_path(node_id: str) -> str:
    return f"/api/v1/nodes/{urllib.parse.quote(node_id, safe='')}"


async def _node(ui: common.Ui, request: Request, node_id: str) -> common.ApiAnswer:
    """describe's document with the node's own entry merged in (disks, weights, HCAs, NVLink, load)."""
    described, _ = await ui.call(request, "GET", f"{_api_path(node_id)}/describe")
    if described.error:
        return described
    # This node's entry only: reading the whole list for it every 2 s was every node's inventory (1,000 nodes,
    # 1.7 MB of JSON) a poll, per open node page.
    listed, _ = await ui.call(request, "GET", _api_path(node_id))
    entry = listed.doc
    doc = {**entry, **described.doc}
    # The list's GPU entries may carry more (NVLink peers) than describe's; the richer one wins, by index.
    by_index = {g.get("index"): g for g in entry.get("gpus", [])}
    doc["gpus"] = [{**g, **by_index.get(g.get("index"), {})} for g in described.doc.get("gpus", [])]
    return common.ApiAnswer(described.status, doc)


async def _render(ui: common.Ui, request: Request, node_id: str, *, error: str = "",
                  status_code: int = 200) -> Response:
    answer = await _node(ui, request, node_id)
    who = await ui.who(request)
    return ui.page(request, "node.html", status_code=answer.status if answer.error else status_code,
                   title=f"Node {node_id}", who=who, node_id=node_id, action_error=error,
                   can_mutate=who[1] not in ("", "viewer"), node={"error": answer.error, "doc": answer.doc})


async def nodes(ui: common.Ui, request: Request) -> Part:
    try:
        page = max(1, int(request.query_params.get("page", "1")))
    except ValueError:
        page = 1
    return await _nodes_at(ui, request, page)


async def _nodes_at(ui: common.Ui, request: Request, page: int) -> Part:
    # One page from the API, not the whole list cut here: with 1,000 nodes the list is 1.7 MB of JSON.
    answer, _ = await ui.call(request, "GET", "/api/v1/nodes",
                              params={"offset": (page - 1) * NODES_PER_PAGE, "limit": NODES_PER_PAGE})
    if answer.error:
        return answer
    total = int(answer.doc.get("total", 0))
    pages = max(1, -(-total // NODES_PER_PAGE))
    if page > pages:  # past the end (nodes went away, or a made-up number): the last page instead
        return await _nodes_at(ui, request, pages)
    return {"nodes": list(answer.doc.get("items", [])), "page": page, "pages": pages, "total": total}


async def node_list(ui: common.Ui, request: Request) -> Response:
    part = await nodes(ui, request)
    if isinstance(part, common.ApiAnswer):
        part = {"error": part.error}
    return ui.page(request, "nodes.html", title="Nodes", who=await ui.who(request), nodes=part)


async def node_page(ui: common.Ui, request: Request) -> Response:
    return await _render(ui, request, request.path_params["node_id"])


async def node_live(ui: common.Ui, request: Request) -> Response:
    """The refreshing part (state, GPUs, shards, load, inventory), for htmx every 2 s."""
    node_id = request.path_params["node_id"]
    answer = await _node(ui, request, node_id)
    return ui.page(request, "_node_live.html", node_id=node_id, node={"error": answer.error, "doc": answer.doc})


async def agent_log(ui: common.Ui, request: Request) -> Response:
    """The agent log's last lines as plain escaped text: the inside of ``<pre id="agent-log">``."""
    node_id = request.path_params["node_id"]
    # Not Ui.call: the answer is NDJSON (batches of lines, or an {"error"} line), not one JSON document.
    resp = await ui.raw(request, "GET", f"{_api_path(node_id)}/logs",
                        params={"lines": str(LOG_LINES), "follow": "false"})
    if not resp.is_success:
        return _log_text([f"(no log: {common.api_message(resp)})"], status_code=resp.status_code)
    lines: list[str] = []
    for raw in resp.text.splitlines():
        try:
            doc = json.loads(raw) if raw.strip() else {}
        except ValueError:
            doc = {"error": f"the control plane sent a line that is not JSON: {raw[:200]!r}"}
        if isinstance(doc, dict) and doc.get("error"):
            lines.append(f"(log ended: {doc['error']})")
        elif isinstance(doc, dict):
            lines.extend(str(x) for x in doc.get("lines") or [])
    return _log_text(lines[-LOG_LINES:] or ["(the agent's log is empty)"])


def _log_text(lines: list[str], *, status_code: int = 200) -> Response:
    html = common.templates.from_string("{{ text }}").render(text="\n".join(lines))
    return HTMLResponse(html, status_code=status_code, headers={"cache-control": "no-store"})


async def mark(ui: common.Ui, request: Request) -> Response:
    node_id, action = request.path_params["node_id"], request.path_params["action"]
    if action not in ACTIONS:
        return await _render(ui, request, node_id, status_code=404,
                             error=f"no node action {action[:40]!r}; there are cordon, uncordon and drain")
    answer, _ = await ui.call(request, "POST", f"{_api_path(node_id)}/{action}")
    if answer.error:
        return await _render(ui, request, node_id, error=answer.error, status_code=answer.status)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/nodes/{urllib.parse.quote(node_id, safe='')}",
                            status_code=303)


def routes(ui: common.Ui) -> list[Route]:
    """The node pages' routes, below the UI's mount."""

    bind = ui.bind
    return [
        Route("/nodes", bind(node_list), methods=["GET"]),
        Route("/nodes/{node_id}", bind(node_page), methods=["GET"]),
        Route("/nodes/{node_id}/live", bind(node_live), methods=["GET"]),
        Route("/nodes/{node_id}/log", bind(agent_log), methods=["GET"]),
        Route("/nodes/{node_id}/{action}", bind(mark), methods=["POST"]),
    ]
