"""``/api/v1/weights``: what each node holds of weights, and which models ask for each (``llmgw get weights``).

One row per weight a node reports: its path and cache name, size, source,
last use and whether llmgw fetched it (only those can ever be removed), with
the models whose source maps to it, so that a person deciding what to delete
by hand, or reading why garbage collection removed something, sees what
still wants each. ``remote`` adds what the control plane read of each remote
source's metadata before placing it (its size, or why it could not be read).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from fastapi import APIRouter

from llmgw.control import remotemeta
from llmgw.control.http import schemas
from llmgw.control.placement import needs
from llmgw.control.state import NodeView
from llmgw.control.store.offloop import StoreThread
from llmgw.core.specs import ModelSpec


class _Cluster(Protocol):
    nodes: dict[str, NodeView]
    remote_meta: remotemeta.Reader | None


class Weight(schemas.Body):
    node: str
    path: str
    cache_name: str
    size_bytes: int
    format: str
    source: str
    last_used_unix: schemas.Number
    fetched_by_llmgw: bool
    models: list[str]


class RemoteRead(schemas.Body):
    """What the control plane read of a remote source's metadata: its size, or why it could not be read."""

    source: str
    size_bytes: int | None
    problem: str
    models: list[str]


class Weights(schemas.Body):
    items: list[Weight]
    remote: list[RemoteRead]


def weights_doc(models: Mapping[str, ModelSpec], nodes: Iterable[NodeView],
                remote: Mapping[str, needs.RemoteWeights] | None = None) -> dict[str, Any]:
    """The body of ``GET /api/v1/weights``: rows by node then path, and the remote reads by source."""
    asks: dict[str, list[str]] = {}
    for name, spec in sorted(models.items()):
        key = needs.weights_key(spec)
        if key:
            asks.setdefault(key, []).append(name)
    rows = []
    for node in sorted(nodes, key=lambda n: n.id):
        for w in sorted(node.inventory.weights, key=lambda w: w.path):
            wanted = sorted(set(asks.get(w.path.rstrip("/"), [])) | set(asks.get(w.source, [])) if w.source
                            else asks.get(w.path.rstrip("/"), []))
            rows.append({"node": node.id, "path": w.path, "cache_name": w.cache_name, "size_bytes": w.size_bytes,
                         "format": w.format, "source": w.source, "last_used_unix": w.last_used_unix,
                         "fetched_by_llmgw": w.fetched_by_llmgw, "models": wanted})
    reads = [{"source": src, "size_bytes": r.weight.size_bytes if r.weight else None, "problem": r.problem,
              "models": asks.get(src, [])} for src, r in sorted((remote or {}).items())]
    return {"items": rows, "remote": reads}


def router(db: StoreThread, cluster: _Cluster) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/weights", response_model=Weights)
    async def list_weights() -> dict[str, Any]:
        models = {m.model.name: m.model.spec for m in await db.list_models()}
        remote = cluster.remote_meta.known() if cluster.remote_meta is not None else None
        # Built off the loop from a snapshot, as the nodes' documents are: 10,000 nodes' weights.
        return await asyncio.to_thread(weights_doc, models, list(cluster.nodes.values()), remote)

    return api
