"""The documents ``/api/v1/nodes`` answers: a node as listed, as described, and its scheduling marks."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from llmgw.control import engines, upgrades
from llmgw.control.cluster import Cluster
from llmgw.control.engineaccess import EngineAccess
from llmgw.control.events import Event
from llmgw.control.http import modeldocs
from llmgw.control.state import NodeView, ReplicaRecord
from llmgw.control.store.store import StoredNode
from llmgw.core import skew
from llmgw.core.shards import ShardState
from llmgw.core.version import version


@functools.cache
def _own_version() -> str:
    """This control plane's llmgw version, read once (a list of a thousand nodes compares each with it)."""
    return version()


def scheduling(view: NodeView | None, *, connected: bool, has_replicas: bool) -> dict[str, Any]:
    """A node's cordon/drain marks and its status words as `kubectl get nodes` would put them."""
    cordoned, draining = bool(view and view.cordoned), bool(view and view.draining)
    words = ["Ready" if connected else "NotReady"]
    if cordoned or draining:
        words.append("SchedulingDisabled")
    if draining and has_replicas:
        words.append("Draining")
    return {"cordoned": cordoned, "draining": draining, "status": ",".join(words)}


def upgrade_doc(cluster: Cluster, node_id: str) -> dict[str, Any] | None:
    """The node's last agent upgrade (``control.upgrades``), the health gate applied, with ``summary`` for
    ``llmgw get nodes``; None when this leader knows none."""
    a = cluster.upgrades.progress(node_id, ready=lambda: upgrades.not_ready(cluster.nodes.get(node_id),
                                                                   cluster.connected(node_id)))
    return None if a is None else {**a.doc(), "summary": a.words()}


def access_doc(access: EngineAccess | None, node_id: str) -> dict[str, str] | None:
    """Issue 33: how routers reach the node's engines (``mode``: direct or tunnel) and why; None: not known yet."""
    mode, reason = access.describe(node_id) if access is not None else ("", "")
    return {"mode": mode, "reason": reason} if mode else None


def node_doc(n: StoredNode, view: NodeView | None, *, connected: bool, has_replicas: bool,
             upgrade: dict[str, Any] | None = None, access: dict[str, str] | None = None) -> dict[str, Any]:
    """A node as ``GET /api/v1/nodes`` lists it: its marks, what it has, and the shards it runs."""
    inv = view.inventory if view else n.inventory
    return {
        "id": n.id, "hostname": n.hostname, "mgmt_addr": n.mgmt_addr, "agent_version": n.agent_version,
        "engine_access": access,
        "version_skew": skew.skewed(n.agent_version, _own_version()),
        "upgrade": upgrade,
        **scheduling(view, connected=connected, has_replicas=has_replicas),
        "connected": connected, "last_seen": n.last_seen, "labels": dict(n.labels), "cpu_count": inv.cpu_count,
        "memory_total_bytes": inv.memory_total_bytes, "memory_available_bytes": inv.memory_available_bytes,
        "gpus": [{"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
                  "memory_used_bytes": g.memory_used_bytes, "utilization_percent": g.utilization_percent,
                  "nvlink_peers": list(g.nvlink_peers)}
                 for g in inv.gpus],
        "engines": [{"name": e, "version": v} for e, v in inv.engines],
        "shards": sum(1 for s in (view.shards.values() if view else ()) if s.state in ShardState.live()),
        "shard_states": [{"id": s.shard_id, "replica": s.replica_id, "state": s.state.value, "pid": s.pid,
                          "adopted": s.adopted, "message": s.message, "probe_failures": s.probe_failures,
                          # The LoRA adapters its engine holds, and why the last load failed: only with adapters.
                          **({"adapters": list(s.adapters)} if s.adapters else {}),
                          **({"adapters_message": s.adapters_message} if s.adapters_message else {})}
                         for s in (view.shards.values() if view else ())],
        "mgmt_interface": inv.mgmt_interface,
        "host": dataclasses.asdict(inv.host),
        "hcas": [dataclasses.asdict(h) for h in inv.hcas],
        "fabrics": [dataclasses.asdict(f) for f in inv.fabrics],
        "model_dirs": [dataclasses.asdict(d) for d in inv.model_dirs],
        "weights": [dataclasses.asdict(w) for w in inv.weights],
        "nvlink": dataclasses.asdict(inv.nvlink),
        "subnet_managers": [dataclasses.asdict(x) for x in inv.subnet_managers],
        "load": {sid: {"cpu_cores": ld.cpu_cores, "rss_bytes": ld.rss_bytes}
                 for sid, ld in (view.shard_load.items() if view else ())},
    }


def nodes_body(page: list[StoredNode], total: int, views: dict[str, NodeView], connected: set[str],
               occupied: set[str], upgrades: dict[str, dict[str, Any]] | None = None,
               access: dict[str, dict[str, str]] | None = None) -> bytes:
    """One page of nodes as the API's JSON, with ``total``, how many there are in all."""
    ups = upgrades or {}
    return json.dumps({"items": [node_doc(n, views.get(n.id), connected=n.id in connected,
                                          has_replicas=n.id in occupied, upgrade=ups.get(n.id),
                                          access=(access or {}).get(n.id))
                                 for n in page],
                       "total": total}).encode()


def describe_doc(node_id: str, stored: StoredNode, mine: list[ReplicaRecord], models: dict[str, str],
                 events: list[Event], cluster: Cluster, now: float) -> dict[str, Any]:
    """``GET /api/v1/nodes/ID/describe``: the node, what llmgw installed there, its replicas and recent events.

    ``mine``: the replicas with a rank on the node; ``models``: each model's fingerprint.
    """
    view = cluster.nodes.get(node_id)
    inv = view.inventory if view else stored.inventory
    return {
        "id": node_id, "hostname": stored.hostname, "mgmt_addr": stored.mgmt_addr,
        "engine_access": access_doc(cluster.engine_access, node_id),
        "agent_version": stored.agent_version, "version_skew": skew.skewed(stored.agent_version, _own_version()),
        "connected": cluster.connected(node_id), "upgrade": upgrade_doc(cluster, node_id),
        "last_seen": stored.last_seen, "labels": stored.labels,
        **scheduling(view, connected=cluster.connected(node_id), has_replicas=bool(mine)),
        "cpu_count": inv.cpu_count, "memory_total_bytes": inv.memory_total_bytes,
        "memory_available_bytes": inv.memory_available_bytes,
        "gpus": [{"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
                  "memory_used_bytes": g.memory_used_bytes, "utilization_percent": g.utilization_percent}
                 for g in inv.gpus],
        "engines": [{"name": e, "version": v} for e, v in inv.engines],
        # What llmgw installed here and each install's state (issue 14); the engines above are what runs.
        "installs": [engines.install_doc(i) for i in inv.installs],
        "replicas": [{**modeldocs.replica_describe(r, cluster, models.get(r.model, ""), now), "model": r.model}
                     for r in mine],
        "shards": [{"id": s.shard_id, "replica": s.replica_id, "state": s.state.value, "message": s.message}
                   for s in (view.shards.values() if view else ()) if s.state in ShardState.live()],
        "events": [modeldocs.event_doc(e) for e in events],
    }
