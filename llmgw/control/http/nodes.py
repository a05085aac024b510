"""``/api/v1/nodes``: nodes listed, read and described, cordoned, uncordoned and drained, and their logs.

A node's certificates and their revocation are ``nodecerts``'s. The list is built off the event loop
from snapshots taken on it: 10,000 nodes' documents held every agent stream and routed request for the
whole build when built on the loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import StreamingResponse

from llmgw.control.cluster import Cluster, LogsError, NodeNotConnected
from llmgw.control.http import modeldocs, nodedocs, paging, schemas
from llmgw.control.http.apierrors import BadRequest, Conflict, NotFound
from llmgw.control.store.offloop import StoreThread
from llmgw.core import shards
from llmgw.core.errors import ShardIdError

#: The log's answer: one JSON object a line, ``{"lines": [...]}``, or last ``{"error": "..."}`` when it broke off.
_LOG_LINES: dict[int | str, dict[str, Any]] = {200: {"description": "NDJSON batches of lines", "content": {
    "application/x-ndjson": {"schema": {"type": "object", "properties": {
        "lines": {"type": "array", "items": {"type": "string"}}, "error": {"type": "string"}}}}}}}


def unknown(node_id: str) -> NotFound:
    return NotFound("node", node_id, "`llmgw get nodes` lists them", says="is not known")


def _ndjson(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc) + "\n").encode()


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/nodes", response_model=schemas.NodeList)
    async def list_nodes(offset: int = paging.offset(), limit: int = paging.limit(default=0, low=0)) -> Response:
        """Every node (``limit`` 0), or a page of them by id; ``total`` counts them all."""
        # Only the page's rows are read and only its documents built: the UI's page of 100 of 1,000
        # nodes read every node and every whole replica before (0.55 s, bench/ui_overview.py).
        (stored, total), occupied = await db.page_nodes(offset=offset, limit=limit), await db.occupied_nodes()
        # Snapshots taken on the loop; the documents (10,000 at 10,000 nodes, ~40 values each) and
        # their JSON are built in a thread, as a pass reads its snapshot (see cluster's docstring).
        views, connected = dict(cluster.nodes), {n.id for n in stored if cluster.connected(n.id)}
        upgrades = {n.id: doc for n in stored if (doc := nodedocs.upgrade_doc(cluster, n.id)) is not None}
        access = {n.id: doc for n in stored if (doc := nodedocs.access_doc(cluster.engine_access, n.id)) is not None}
        body = await asyncio.to_thread(nodedocs.nodes_body, stored, total, views, connected, occupied, upgrades,
                                       access)
        return Response(body, media_type="application/json")

    @api.get("/api/v1/nodes/{node_id}", response_model=schemas.Node)
    async def get_node(node_id: str) -> dict[str, Any]:
        """One node: the document its entry of ``GET /api/v1/nodes`` is (the node page polls this, not the list)."""
        stored = await db.get_node(node_id)
        if stored is None:
            raise unknown(node_id)
        occupied = await db.occupied_nodes()
        return nodedocs.node_doc(stored, cluster.nodes.get(node_id), connected=cluster.connected(node_id),
                                 has_replicas=node_id in occupied, upgrade=nodedocs.upgrade_doc(cluster, node_id),
                                 access=nodedocs.access_doc(cluster.engine_access, node_id))

    @api.get("/api/v1/nodes/{node_id}/describe", response_model=schemas.NodeDescribe,
             response_model_exclude_unset=True)
    async def describe_node(node_id: str) -> dict[str, Any]:
        stored = await db.get_node(node_id)
        if stored is None:
            raise unknown(node_id)
        now = time.time()
        models = {m.model.name: m.model.spec.fingerprint() for m in await db.list_models()}
        # A multi-node replica is on every rank's node, not only its leader's.
        mine = [r for r in await db.list_replicas() if node_id in (r.node_id, *(m.node_id for m in r.members))]
        events = await db.list_events(node=node_id, limit=modeldocs.DESCRIBE_EVENTS)
        return nodedocs.describe_doc(node_id, stored, mine, models, events, cluster, now)

    api.include_router(_marks(db, cluster))
    api.include_router(_logs(cluster))
    return api


def _marks(db: StoreThread, cluster: Cluster) -> APIRouter:
    """Cordon, uncordon and drain: each answers the node's marks and status words."""
    api = APIRouter()

    async def _mark(node_id: str, *, cordoned: bool, draining: bool) -> dict[str, Any]:
        if not await cluster.mark_node(node_id, cordoned=cordoned, draining=draining):
            raise unknown(node_id)
        has = any(node_id in (r.node_id, *(m.node_id for m in r.members)) for r in await db.list_replicas())
        return {"id": node_id, **nodedocs.scheduling(cluster.nodes.get(node_id), connected=cluster.connected(node_id),
                                                     has_replicas=has)}

    @api.post("/api/v1/nodes/{node_id}/cordon", response_model=schemas.Scheduling)
    async def cordon(node_id: str) -> dict[str, Any]:
        """No new replica is placed on the node; what runs there stays."""
        return await _mark(node_id, cordoned=True, draining=False)

    @api.post("/api/v1/nodes/{node_id}/uncordon", response_model=schemas.Scheduling)
    async def uncordon(node_id: str) -> dict[str, Any]:
        """Replicas may be placed on the node again (a drain in progress stops: what has moved stays moved)."""
        return await _mark(node_id, cordoned=False, draining=False)

    @api.post("/api/v1/nodes/{node_id}/drain", response_model=schemas.Scheduling)
    async def drain(node_id: str) -> dict[str, Any]:
        """Cordons the node and moves its replicas elsewhere, each once its replacement is Ready."""
        return await _mark(node_id, cordoned=True, draining=True)

    return api


def _logs(cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/nodes/{node_id}/logs", response_class=StreamingResponse, responses=_LOG_LINES)
    async def node_logs(node_id: str, shard: str = "", lines: int = Query(default=100, ge=0, le=10_000),
                        follow: bool = False) -> StreamingResponse:
        """A node's agent log (or a shard's engine output with ``shard``), as NDJSON batches of lines."""
        if shard:
            try:
                # The agent checks too; refused here, a "../../etc/passwd" never leaves the control plane.
                shards.check_shard_id(shard)
            except ShardIdError as e:
                raise BadRequest(str(e), code="invalid_shard_id", param="shard") from None
        it = cluster.logs(node_id, shard, lines=lines, follow=follow)
        try:
            first = await anext(it)
        except StopAsyncIteration:
            first = []
        except KeyError:
            raise unknown(node_id) from None
        except NodeNotConnected as e:
            raise Conflict(str(e), code="node_not_connected") from None
        except LogsError as e:
            raise NotFound.said(str(e), code="logs_unavailable") from None

        async def body() -> AsyncIterator[bytes]:
            try:
                yield _ndjson({"lines": first})
                async for batch in it:
                    if batch:
                        yield _ndjson({"lines": batch})
            except LogsError as e:
                yield _ndjson({"error": str(e)})
            finally:
                await it.aclose()

        return StreamingResponse(body(), media_type="application/x-ndjson")

    return api
