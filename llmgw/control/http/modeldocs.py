"""The documents ``/api/v1/models`` answers: a model's manifest with its status, and its describe.

``describe`` answers in one document what a person asks when a model is not serving: what was asked
for, where each replica is and what holds of it (conditions, with since-when), and what happened lately
(events), so `llmgw describe model m` needs no second request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from llmgw.control import loadreports
from llmgw.control.cluster import Cluster, in_force
from llmgw.control.conditions import Condition
from llmgw.control.events import Event
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.status import adapters_of, fetch_of, sleep_level_of, summarize
from llmgw.control.store.store import StoredAutoscale, StoredModel

#: Events a describe shows (the newest).
DESCRIBE_EVENTS = 50


def conditions(cs: tuple[Condition, ...]) -> list[dict[str, Any]]:
    return [c.to_doc() for c in cs]


def event_doc(e: Event) -> dict[str, Any]:
    return dataclasses.asdict(e)


def _autoscale(stored: StoredModel, replicas: int, states: Mapping[str, StoredAutoscale],
               signals: loadreports.RouterSignals | None, now: float) -> dict[str, Any] | None:
    """An autoscaled model's ``autoscale`` block (None for one scaled by hand)."""
    name, auto = stored.model.name, stored.model.spec.autoscale
    if auto is None:
        return None
    kept = states.get(name)
    return loadreports.describe(auto, replicas, last_reason=kept.last_reason if kept else "",
                               last_change_at=kept.last_change_at if kept else 0.0, signals=signals, model=name,
                               now=now)


def model_doc(stored: StoredModel, replicas: list[ReplicaRecord], now: float,
              states: Mapping[str, StoredAutoscale] | None = None,
              signals: loadreports.RouterSignals | None = None) -> dict[str, Any]:
    """The manifest and its status; an autoscaled model's ``replicas`` is the count in force, and with ``signals``
    its ``status.autoscale`` carries the routers' merged load as the autoscaler reads it."""
    name = stored.model.name
    spec = in_force({name: stored.model.spec}, states or {})[name]
    st = summarize(spec, replicas, now=now)
    doc = stored.model.to_manifest()
    doc["status"] = {"state": st.state, "message": st.message, "ready_replicas": st.ready,
                     "replicas": st.desired, "generation": stored.generation}
    scaled = _autoscale(stored, spec.replicas, states or {}, signals, now)
    if scaled is not None:
        doc["status"]["autoscale"] = scaled
    return doc


def replica_describe(r: ReplicaRecord, cluster: Cluster, fp: str, now: float) -> dict[str, Any]:
    """A replica as a describe shows it: where it runs, whether it is current, its conditions."""
    return {"id": r.id, "phase": r.phase.value, "node": r.node_id, "shard": r.shard_id,
            "gpus": list(getattr(r, "gpus", ()) or ()),
            "endpoint": r.endpoint if r.phase is Phase.READY else "", "attempt": r.attempt,
            "failures": r.failures, "message": r.message, "last_output": list(r.last_output),
            "fingerprint": r.fingerprint, "current": r.fingerprint == fp, "age_s": round(now - r.created_at, 1),
            "conditions": conditions(cluster.conditions_of(f"replica/{r.id}")), "fetch": fetch_of(r, cluster.nodes),
            "adapters": adapters_of(r, cluster.nodes),
            "sleep_level": sleep_level_of(r, cluster.nodes)}


def describe_doc(stored: StoredModel, mine: list[ReplicaRecord], events: list[Event], cluster: Cluster,
                 states: Mapping[str, StoredAutoscale], now: float) -> dict[str, Any]:
    """``GET /api/v1/models/NAME/describe``: the spec, its status, each replica, conditions and recent events."""
    name = stored.model.name
    spec = in_force({name: stored.model.spec}, states)[name]  # an autoscaled model's count in force
    st = summarize(spec, mine, now=now)
    fp = spec.fingerprint()
    scaled = _autoscale(stored, spec.replicas, states, cluster.signals, now)
    return {
        "name": name, "spec": stored.model.to_manifest()["spec"], "fingerprint": fp,
        "generation": stored.generation, "created_at": stored.created_at, "updated_at": stored.updated_at,
        "status": {"state": st.state, "message": st.message, "ready_replicas": st.ready,
                   "replicas": st.desired,
                   "updated_replicas": sum(1 for r in mine if r.fingerprint == fp
                                           and r.phase is not Phase.TERMINATING)},
        "conditions": conditions(cluster.conditions_of(f"model/{name}")),
        "replicas": [replica_describe(r, cluster, fp, now) for r in mine],
        "events": [event_doc(e) for e in events],
        **({} if scaled is None else {"autoscale": scaled}),
    }
