"""``/api/v1/nodes/{name}/upgrade``: upgrade a node's agent to another llmgw release, and follow it (issue 29).

``POST`` (an admin's, audited) checks the node, the version and the cluster's engine index and sends the agent an
``UpgradeAgent`` (``control.upgrades``); ``GET`` answers the node's last attempt with the health gate applied
(``done`` once the node is back with the new version and every shard Ready). One node at a time is the
caller's order: `llmgw node upgrade --all` upgrades the next node only after this one's attempt is done.
The package comes from the index engines are installed from (``--engine-index``), never the public index.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter

from llmgw.control.cluster import Cluster
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import BadRequest, Conflict, NotFound
from llmgw.control.store.offloop import StoreThread
from llmgw.control.upgrades import READY_TIMEOUT_S, not_ready
from llmgw.core.agentupgrade import version_problem
from llmgw.core.version import UNINSTALLED, version

NO_INDEX = ("no package index is set for this cluster: start the control plane with --engine-index URL (the index "
            "engines are installed from; it must hold llmgw {v} and its dependencies); agents never install from the "
            "public index")


class UpgradeBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    #: The llmgw release to run; "" (or left out): the control plane's own.
    version: str = pydantic.Field(default="", max_length=64)
    #: How long the node has, after its agent restarts, to be back with the new version and its shards Ready.
    ready_timeout_s: float = pydantic.Field(default=READY_TIMEOUT_S, ge=1, le=3600)
    #: A node that already runs the version is answered ``done`` (nothing sent) instead of refused (409):
    #: what `llmgw node upgrade --all` asks, so nodes upgraded before are passed over.
    skip_if_current: bool = False


class UpgradeAttempt(schemas.Body):
    id: str
    node: str
    version: str
    from_version: str
    state: str = pydantic.Field(description="sent, installing, restarting, registered, done or failed")
    message: str
    last_output: list[str]
    started: schemas.Number
    updated: schemas.Number


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.post("/api/v1/nodes/{node_id}/upgrade", response_model=UpgradeAttempt)
    async def upgrade(node_id: str, body: UpgradeBody | None = None) -> dict[str, Any]:
        """Sends the node's agent the upgrade to ``version`` (default: this control plane's); follow it with GET."""
        body = body or UpgradeBody()
        want = body.version or version()
        if want == UNINSTALLED:
            raise BadRequest("this control plane runs from a checkout (its version is 'dev'); name the release: "
                             "--version V", code="invalid_version", param="version")
        if problem := version_problem(want):
            raise BadRequest(problem, code="invalid_version", param="version")
        stored = await db.get_node(node_id)
        if stored is None:
            raise NotFound("node", node_id, "`llmgw get nodes` lists them", says="is not known")
        if stored.agent_version == want and body.skip_if_current:
            now = cluster.clock()
            return {"id": "", "node": node_id, "version": want, "from_version": want, "state": "done",
                    "message": f"already runs llmgw {want}; nothing sent", "last_output": [], "started": now,
                    "updated": now}
        link = cluster.link(node_id)
        if link is None or not cluster.connected(node_id):
            raise Conflict(f"node {node_id} is not connected; its agent must be running to upgrade itself "
                           "(`llmgw get nodes` shows it)", code="not_connected")
        if stored.agent_version == want:
            raise Conflict(f"node {node_id}'s agent already runs llmgw {want}", code="already_upgraded")
        if (busy := cluster.upgrades.under_way(node_id)) is not None:
            raise Conflict(f"node {node_id} is being upgraded to {busy.version} already ({busy.state}); wait for it "
                           f"to end: `llmgw describe node {node_id}`", code="upgrade_under_way")
        settings = cluster.engine_settings
        if not settings.index_url:
            raise BadRequest(NO_INDEX.format(v=want), code="no_index")
        attempt = cluster.upgrades.start(node_id, link, version=want,
                                         from_version=stored.agent_version, index_url=settings.index_url,
                                         find_links=settings.find_links, ready_timeout_s=body.ready_timeout_s)
        cluster.flush_events()
        return attempt.doc()

    @api.get("/api/v1/nodes/{node_id}/upgrade", response_model=UpgradeAttempt)
    async def progress(node_id: str) -> dict[str, Any]:
        """The node's last upgrade attempt (this leader's), moved on by the health gate."""
        attempt = cluster.upgrades.progress(
            node_id, ready=lambda: not_ready(cluster.nodes.get(node_id), cluster.connected(node_id)))
        if attempt is None:
            raise NotFound("upgrade of node", node_id, "`llmgw node upgrade NODE` starts one; a new leader knows "
                           "none its predecessor started (`llmgw events` lists them)", says="is not known here")
        cluster.flush_events()
        return attempt.doc()

    return api
