"""``/api/v1/engines``: engine versions wanted per node or pool, each node's installs, and removals.

A thin router over ``llmgw.control.engines``, which owns the wants and decides
removals; a refusal there becomes an OpenAI-shaped error here. Reading needs a
viewer, changing an operator (the permission table); every change is audited.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter, Response

from llmgw.control import engines
from llmgw.control.cluster import Cluster
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import ApiError, NotFound
from llmgw.control.store.offloop import StoreThread


class EngineTarget(pydantic.BaseModel):
    """An engine version on one node, or on every node of a pool."""

    model_config = pydantic.ConfigDict(extra="forbid")

    engine: str = pydantic.Field(min_length=1, max_length=64)
    version: str = pydantic.Field(min_length=1, max_length=64)
    node: str = pydantic.Field(default="", max_length=253)
    pool: str = pydantic.Field(default="", max_length=63)


class Engines(schemas.Body):
    """The wants (versions asked for per node or pool), the install settings, and each node's installs."""

    wants: list[dict[str, Any]]
    settings: dict[str, Any]
    nodes: list[dict[str, Any]]


class WantAdded(schemas.Body):
    scope: str
    engine: str
    version: str
    created: bool


class WantDeleted(schemas.Body):
    deleted: bool


class Removal(schemas.Body):
    """The nodes told to remove the version, and those that were not connected to be told."""

    sent: list[str]
    not_connected: list[str]


def _refused(e: engines.EngineRefused) -> ApiError:
    """``engines`` chose the status and wrote the sentence (a version it does not know, one still in use)."""
    return ApiError(e.status, str(e), code=e.code)


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/engines", response_model=Engines)
    async def list_engines() -> dict[str, Any]:
        return engines.engines_doc(cluster)

    @api.post("/api/v1/engines", status_code=201, response_model=WantAdded)
    async def add_want(body: EngineTarget, response: Response) -> dict[str, Any]:
        try:
            want, added = await engines.install(db, cluster, body.engine, body.version, node=body.node,
                                                pool=body.pool)
        except engines.EngineRefused as e:
            raise _refused(e) from None
        if not added:
            response.status_code = 200  # already wanted: nothing changed
        return {"scope": want.scope, "engine": want.engine, "version": want.version, "created": added}

    # A body, as POST's: the audit log names the object from it (a query string it never reads).
    @api.delete("/api/v1/engines", response_model=WantDeleted)
    async def delete_want(body: EngineTarget) -> dict[str, Any]:
        try:
            gone = await engines.forget(db, cluster, body.engine, body.version, node=body.node, pool=body.pool)
        except engines.EngineRefused as e:
            raise _refused(e) from None
        if not gone:
            where = f"node {body.node}" if body.node else f"pool {body.pool}"
            raise NotFound(f"{body.engine} {body.version}", "", "`llmgw engine list` shows the wants",
                           says=f"is not wanted on {where}", code="not_found")
        return {"deleted": True}

    @api.post("/api/v1/engines/remove", response_model=Removal)
    async def remove(body: EngineTarget) -> dict[str, Any]:
        try:
            done = await engines.remove(db, cluster, body.engine, body.version, node=body.node, pool=body.pool)
        except engines.EngineRefused as e:
            raise _refused(e) from None
        return {"sent": list(done.sent), "not_connected": list(done.not_connected)}

    return api
