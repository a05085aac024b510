"""The control plane's loop with a real SQLite store and a stepped clock: events, conditions, cordon marks.

The agent's side is a link that records the commands it was given, so each
pass is run by hand and what it wrote is read back from the store, across a
"restart" (a second Cluster on the same database).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmgw.control.cluster import Cluster
from llmgw.control.reconcile import decide
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.testing import stepped

INV = Inventory(cpu_count=8, memory_total_bytes=16 << 30, memory_available_bytes=12 << 30, engines=(("sim", "1"),))
MODEL = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                              "spec": {"engine": "sim", "replicas": 1}})


def cluster(store: Store, clock: stepped.Clock) -> Cluster:
    return Cluster(store, clock=clock, cfg=decide.Config(node_grace_s=30), heartbeat_timeout_s=1e9)


def register(c: Cluster, node_id: str, link: stepped.Link, shards: list[ShardStatus] | None = None) -> None:
    c.node_registered(StoredNode(node_id, node_id, "127.0.0.1", "0", INV, {}, 0.0, c.clock()), shards or [], link)


def reasons(store: Store, **kw: Any) -> list[str]:
    return [e.reason for e in store.list_events(**kw)]


def test_a_replica_life_is_told_once_and_its_conditions_survive_a_restart(tmp_path: Path) -> None:
    """Created, Scheduled, Ready events; Ready's transition time is kept by a restarted control plane."""
    store, clock, link = Store.open(tmp_path), stepped.Clock(), stepped.Link()
    store.put_model(MODEL)
    c = cluster(store, clock)
    register(c, "n1", link)
    c.reconcile_once()
    clock.now += 1
    c.reconcile_once()
    (rid,) = [r.id for r in store.list_replicas()]
    (_, shard), = link.sent
    c.shard_reported("n1", ShardStatus(shard, rid, ShardState.READY, endpoint="http://e"))
    clock.now += 1
    c.reconcile_once()
    for _ in range(3):  # passes that change nothing add nothing
        clock.now += 1
        c.reconcile_once()
    assert reasons(store, obj=f"replica/{rid}") == ["Created", "Scheduled", "Ready"]
    assert "NodeRegistered" in reasons(store, node="n1")
    ready = {x.type: x for x in c.conditions_of(f"replica/{rid}")}["Ready"]
    assert (ready.status, ready.last_transition) == ("True", 1002.0)
    model = {x.type: x for x in c.conditions_of("model/m")}
    assert model["Ready"].status == "True" and model["Degraded"].status == "False"
    assert "ReplicasReady" in reasons(store, model="m")  # Ready turned True: a model event

    clock.now += 100  # a restart: the same database, a new instance, the agent reconnects with its shard
    again = cluster(store, clock)
    register(again, "n1", stepped.Link(), [ShardStatus(shard, rid, ShardState.READY, endpoint="http://e")])
    again.reconcile_once()
    ready = {x.type: x for x in again.conditions_of(f"replica/{rid}")}["Ready"]
    assert (ready.status, ready.last_transition) == ("True", 1002.0)
    assert store.conditions()[0][rid] == again.conditions_of(f"replica/{rid}")
    assert reasons(store, obj=f"replica/{rid}") == ["Created", "Scheduled", "Ready"]  # nothing re-told


def test_silent_node_is_not_ready_after_its_grace_and_cordon_survives_everything(tmp_path: Path) -> None:
    """Disconnect, then NotReady once past the grace; a cordon stays through re-registration and restart."""
    store, clock, link = Store.open(tmp_path), stepped.Clock(), stepped.Link()
    c = cluster(store, clock)
    register(c, "n1", link)
    assert c.set_scheduling("n1", cordoned=True, draining=False) and not c.set_scheduling("x", cordoned=True,
                                                                                         draining=False)
    c.node_disconnected("n1", link)
    clock.now += 29
    c.reconcile_once()
    assert "NodeNotReady" not in reasons(store, node="n1")
    clock.now += 2
    c.reconcile_once()
    c.reconcile_once()
    assert reasons(store, node="n1") == ["NodeRegistered", "NodeCordoned", "NodeDisconnected", "NodeNotReady"]
    register(c, "n1", stepped.Link())
    assert c.nodes["n1"].cordoned  # the agent's registration does not undo the operator's cordon
    restarted = cluster(store, clock)
    assert restarted.nodes["n1"].cordoned and not restarted.nodes["n1"].draining
    register(restarted, "n1", stepped.Link())
    assert restarted.nodes["n1"].cordoned
