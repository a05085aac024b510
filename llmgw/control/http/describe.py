"""REST for looking closer and steering nodes: events, describe, cordon/uncordon/drain.

``describe`` answers in one document what a person asks when a model is not
serving: what was asked for, where each replica is and what holds of it
(conditions, with since-when), and what happened lately (events), so
`llmgw describe model m` needs no second request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from fastapi import APIRouter, Response

from llmgw.control import engines, loadreports
from llmgw.control.cluster import Cluster, in_force
from llmgw.control.conditions import Condition
from llmgw.control.events import Event
from llmgw.control.http import paging
from llmgw.control.http.errors import ApiError
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.status import fetch_of, summarize
from llmgw.control.store.offloop import StoreThread
from llmgw.core.shards import ShardState

#: Events a describe shows (the newest).
DESCRIBE_EVENTS = 50


def scheduling(view: NodeView | None, *, connected: bool, has_replicas: bool) -> dict[str, Any]:
    """A node's cordon/drain marks and its status words as `kubectl get nodes` would put them."""
    cordoned, draining = bool(view and view.cordoned), bool(view and view.draining)
    words = ["Ready" if connected else "NotReady"]
    if cordoned or draining:
        words.append("SchedulingDisabled")
    if draining and has_replicas:
        words.append("Draining")
    return {"cordoned": cordoned, "draining": draining, "status": ",".join(words)}


def _conds(cs: tuple[Condition, ...]) -> list[dict[str, Any]]:
    return [c.to_doc() for c in cs]


def _event(e: Event) -> dict[str, Any]:
    return dataclasses.asdict(e)


def _events_body(events: list[Event]) -> bytes:
    return json.dumps({"items": [_event(e) for e in events]}).encode()


def _replica(r: ReplicaRecord, cluster: Cluster, fp: str, now: float) -> dict[str, Any]:
    return {"id": r.id, "phase": r.phase.value, "node": r.node_id, "shard": r.shard_id,
            "gpus": list(getattr(r, "gpus", ()) or ()),
            "endpoint": r.endpoint if r.phase is Phase.READY else "", "attempt": r.attempt,
            "failures": r.failures, "message": r.message, "last_output": list(r.last_output),
            "fingerprint": r.fingerprint, "current": r.fingerprint == fp, "age_s": round(now - r.created_at, 1),
            "conditions": _conds(cluster.conditions_of(f"replica/{r.id}")), "fetch": fetch_of(r, cluster.nodes)}


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/events")
    async def list_events(object: str | None = None, model: str | None = None, node: str | None = None,
                          since: float | None = paging.since_time(), after: int = paging.after_id(),
                          limit: int = paging.limit(default=500)) -> Response:
        """Events, oldest first; ``model``/``node`` include their replicas'; ``after`` an id, for following."""
        items = await db.list_events(obj=object, model=model, node=node, since=since, after_id=after, limit=limit)
        # Made JSON off the loop too: a page of 500 took ~25 ms of the loop's time as dicts through
        # FastAPI's encoder, as long as the query itself, on every page `llmgw events` reads.
        return Response(await asyncio.to_thread(_events_body, items), media_type="application/json")

    @api.get("/api/v1/models/{name}/describe")
    async def describe_model(name: str) -> dict[str, Any]:
        stored = await db.get_model(name)
        if stored is None:
            raise ApiError(404, f"model {name!r} does not exist; `llmgw get models` lists them",
                           code="model_not_found")
        now, states = time.time(), await db.autoscale_states()
        spec = in_force({name: stored.model.spec}, states)[name]  # an autoscaled model's count in force
        mine = [r for r in await db.list_replicas() if r.model == name]
        st = summarize(spec, mine, now=now)
        fp = spec.fingerprint()
        kept, auto = states.get(name), spec.autoscale
        scaled = {} if auto is None else {"autoscale": loadreports.describe(
            auto, spec.replicas, last_reason=kept.last_reason if kept else "",
            last_change_at=kept.last_change_at if kept else 0.0, signals=cluster.signals, model=name, now=now)}
        return {
            "name": name, "spec": stored.model.to_manifest()["spec"], "fingerprint": fp,
            "generation": stored.generation, "created_at": stored.created_at, "updated_at": stored.updated_at,
            "status": {"state": st.state, "message": st.message, "ready_replicas": st.ready,
                       "replicas": st.desired,
                       "updated_replicas": sum(1 for r in mine if r.fingerprint == fp
                                               and r.phase is not Phase.TERMINATING)},
            "conditions": _conds(cluster.conditions_of(f"model/{name}")),
            "replicas": [_replica(r, cluster, fp, now) for r in mine],
            "events": [_event(e) for e in await db.list_events(model=name, limit=DESCRIBE_EVENTS)],
            **scaled,
        }

    @api.get("/api/v1/nodes/{node_id}/describe")
    async def describe_node(node_id: str) -> dict[str, Any]:
        stored = await db.get_node(node_id)
        if stored is None:
            raise ApiError(404, f"node {node_id!r} is not known; `llmgw get nodes` lists them",
                           code="node_not_found")
        now, view = time.time(), cluster.nodes.get(node_id)
        inv = view.inventory if view else stored.inventory
        models = {m.model.name: m.model.spec.fingerprint() for m in await db.list_models()}
        # A multi-node replica is on every rank's node, not only its leader's.
        mine = [r for r in await db.list_replicas() if node_id in (r.node_id, *(m.node_id for m in r.members))]
        return {
            "id": node_id, "hostname": stored.hostname, "mgmt_addr": stored.mgmt_addr,
            "agent_version": stored.agent_version, "connected": cluster.connected(node_id),
            "last_seen": stored.last_seen, "labels": stored.labels,
            **scheduling(view, connected=cluster.connected(node_id), has_replicas=bool(mine)),
            "cpu_count": inv.cpu_count, "memory_total_bytes": inv.memory_total_bytes,
            "memory_available_bytes": inv.memory_available_bytes,
            "gpus": [{"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
                      "memory_used_bytes": g.memory_used_bytes} for g in inv.gpus],
            "engines": [{"name": e, "version": v} for e, v in inv.engines],
            # What llmgw installed here and each install's state (issue 14); the engines above are what runs.
            "installs": [engines.install_doc(i) for i in inv.installs],
            "replicas": [{**_replica(r, cluster, models.get(r.model, ""), now), "model": r.model} for r in mine],
            "shards": [{"id": s.shard_id, "replica": s.replica_id, "state": s.state.value, "message": s.message}
                       for s in (view.shards.values() if view else ()) if s.state in ShardState.live()],
            "events": [_event(e) for e in await db.list_events(node=node_id, limit=DESCRIBE_EVENTS)],
        }

    async def _mark(node_id: str, *, cordoned: bool, draining: bool) -> dict[str, Any]:
        if not await cluster.mark_node(node_id, cordoned=cordoned, draining=draining):
            raise ApiError(404, f"node {node_id!r} is not known; `llmgw get nodes` lists them",
                           code="node_not_found")
        has = any(node_id in (r.node_id, *(m.node_id for m in r.members)) for r in await db.list_replicas())
        return {"id": node_id, **scheduling(cluster.nodes.get(node_id), connected=cluster.connected(node_id),
                                            has_replicas=has)}

    @api.post("/api/v1/nodes/{node_id}/cordon")
    async def cordon(node_id: str) -> dict[str, Any]:
        """No new replica is placed on the node; what runs there stays."""
        return await _mark(node_id, cordoned=True, draining=False)

    @api.post("/api/v1/nodes/{node_id}/uncordon")
    async def uncordon(node_id: str) -> dict[str, Any]:
        """Replicas may be placed on the node again (a drain in progress stops: what has moved stays moved)."""
        return await _mark(node_id, cordoned=False, draining=False)

    @api.post("/api/v1/nodes/{node_id}/drain")
    async def drain(node_id: str) -> dict[str, Any]:
        """Cordons the node and moves its replicas elsewhere, each once its replacement is Ready."""
        return await _mark(node_id, cordoned=True, draining=True)

    return api
