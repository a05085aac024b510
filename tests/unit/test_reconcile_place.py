"""Place, stepped with plain data: Pending replicas get a node (a group: one per rank) and their StartShards."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_placement_data import spec
from test_reconcile_data import (
    CFG,
    GROUP_FP,
    GROUP_SPEC,
    NOW,
    SPEC,
    commands,
    group,
    ib_node,
    one_node,
    rep,
    run,
    run_group,
    updates,
)

from llmgw.control.placement import fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.control.store.store import Store
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus


def leaving_node(nid: str, *, leaving: str = "", stopped: str = "") -> NodeView:
    """A node whose agent may have said goodbye (``leaving``), having stopped shard ``stopped`` on its way out."""
    inv = Inventory(cpu_count=4, memory_total_bytes=8 << 30, memory_available_bytes=4 << 30, engines=(("sim", "1"),))
    shards = {stopped: ShardStatus(stopped, "r1", ShardState.STOPPED, message="agent stopping")} if stopped else {}
    return NodeView(nid, inv, connected=True, shards=shards, reported=True, leaving=leaving)


def test_pending_replica_is_placed_and_started_target_first() -> None:
    """A pending replica gets a node and a shard id; the target is written before the command."""
    out = run([rep()], [one_node()])
    assert isinstance(out[0], d.UpdateReplica) and isinstance(out[1], d.StartShard)
    r = out[0].record
    assert (r.phase, r.node_id, r.shard_id, r.attempt, r.started_at) == (Phase.STARTING, "n1", "r1-1", 1, 1000.0)
    assert out[1].node_id == "n1" and out[1].spec.shard_id == "r1-1" and out[1].spec.api_key == "k"


def test_unplaceable_replica_says_why() -> None:
    """With no node the replica stays Pending with the refusal as its message: make a join token, then run the
    `llmgw agent join` command it prints (a bare `llmgw agent --server` is refused by a secure control plane)."""
    out = run([rep()], [])
    assert updates(out)["r1"].phase is Phase.PENDING
    message = updates(out)["r1"].message
    assert "run `llmgw token create`" in message and "the `llmgw agent join --server" in message, message
    assert "start one with `llmgw agent --server" not in message
    assert not [x for x in out if isinstance(x, d.StartShard)]


def test_a_pending_group_gets_one_shard_per_rank_on_one_fabric() -> None:
    """Two nodes of ib-a take the ranks (not the ib-b one); every StartShard names the leader; target first."""
    pending = ReplicaRecord("r1", "m", GROUP_FP, Phase.PENDING, "k")
    out = run_group([pending], [ib_node("n1", "ib-a", "mlx5_0", "mlx5_1"), ib_node("n2", "ib-b"),
                                ib_node("n3", "ib-a")])
    assert isinstance(out[0], d.UpdateReplica)
    r = out[0].record
    assert r.members == (Member(0, "n1", "r1-1-0", (0, 1), ("mlx5_0", "mlx5_1")),
                         Member(1, "n3", "r1-1-1", (0, 1), ("mlx5_0",)))
    assert (r.phase, r.node_id, r.shard_id, r.gpus) == (Phase.STARTING, "n1", "r1-1-0", (0, 1))
    assert (r.leader_addr, r.leader_port, r.attempt) == ("10.0.0.1", 29500, 1)
    starts = [x for x in out if isinstance(x, d.StartShard)]
    assert [(x.node_id, x.spec.rank, x.spec.nnodes, x.spec.hcas, x.spec.gpus) for x in starts] == [
        ("n1", 0, 2, ("mlx5_0", "mlx5_1"), (0, 1)), ("n3", 1, 2, ("mlx5_0",), (0, 1))]
    assert {(x.spec.leader_addr, x.spec.leader_port, x.spec.api_key, x.spec.replica_id) for x in starts} == {
        ("10.0.0.1", 29500, "k", "r1")}


def test_a_group_that_does_not_fit_stays_pending_and_says_why() -> None:
    """One node of the fabric is not enough for two ranks: no shard is started."""
    out = run_group([ReplicaRecord("r1", "m", GROUP_FP, Phase.PENDING, "k")], [ib_node("n1"), ib_node("n2", "ib-b")])
    r = updates(out)["r1"]
    assert r.phase is Phase.PENDING and r.members == ()
    assert "no declared fabric has 2 nodes" in r.message
    assert not commands(out, d.StartShard)


def test_a_second_group_in_another_pass_gets_its_own_ports_and_gpus() -> None:
    """A placed group's GPUs (on every rank's node) and its leader's port are not given to the next."""
    nodes = [ib_node(f"n{i}", gpus=4) for i in (1, 2)]
    two = {"m": spec(gpus=2, nnodes=2, placement="binpack", replicas=2)}
    placed = group(fingerprint=two["m"].fingerprint())
    out = run_group([placed, ReplicaRecord("r2", "m", placed.fingerprint, Phase.PENDING, "k")], nodes, models=two)
    r2 = updates(out)["r2"]
    assert [(m.node_id, m.gpus) for m in r2.members] == [("n1", (2, 3)), ("n2", (2, 3))]
    assert r2.leader_port == 29501


def test_the_ledger_counts_each_rank_on_its_own_node() -> None:
    """GPUs and threads of a group are held on every member's node, not all on the leader's."""
    threaded = {"m": dataclasses.replace(GROUP_SPEC,
                                         resources=dataclasses.replace(GROUP_SPEC.resources, cpu_threads=3))}
    ledger = fit.Ledger([group()], threaded)
    assert ledger.gpus == {"n1": {0: "r1", 1: "r1"}, "n2": {0: "r1", 1: "r1"}}
    assert ledger.threads == {"n1": 3, "n2": 3}
    # Its model deleted: the GPUs stay held on every node until the shards are gone.
    assert fit.Ledger([group(Phase.TERMINATING)], {}).gpus["n2"] == {0: "r1", 1: "r1"}


def test_members_survive_the_store(tmp_path: Path) -> None:
    """A group's ranks and its leader are persisted (migration 0004) and read back as written."""
    store = Store.open(tmp_path / "data")
    try:
        written = group(Phase.READY, endpoint="http://n1:8000", created_at=NOW)
        store.write_replicas(upserts=[written], now=NOW)
        (back,) = store.list_replicas()
        assert back == written
        store.write_replicas(upserts=[dataclasses.replace(back, members=(), leader_addr="", leader_port=0)], now=NOW)
        assert store.list_replicas()[0].members == ()
    finally:
        store.close()


def test_a_shard_stopped_by_its_leaving_agent_is_not_started_again_there() -> None:
    """The replica whose shard its leaving agent stopped goes Pending, and no StartShard goes to that node: with
    no other node it waits, saying the node is leaving; with another node it starts there."""
    r = ReplicaRecord(id="r1", model="m", fingerprint=SPEC.fingerprint(), phase=Phase.READY, api_key="k",
                      node_id="n1", shard_id="r1-1", attempt=1)
    alone = decide.reconcile({"m": SPEC}, [r], {"n1": leaving_node("n1", leaving="agent stopping", stopped="r1-1")},
                             now=1000.0, cfg=CFG)
    assert [x for x in alone if isinstance(x, d.StartShard)] == []
    # The next pass, with the replica Pending: placement refuses the leaving node and says why.
    pending = dataclasses.replace(r, phase=Phase.PENDING, node_id=None, shard_id=None)
    again = decide.reconcile({"m": SPEC}, [pending], {"n1": leaving_node("n1", leaving="agent stopping")}, now=1001.0,
                             cfg=CFG)
    assert [x for x in again if isinstance(x, d.StartShard)] == []
    message = next(x.record.message for x in again if isinstance(x, d.UpdateReplica))
    assert "is leaving (agent stopping)" in message, message
    elsewhere = decide.reconcile({"m": SPEC}, [pending], {"n1": leaving_node("n1", leaving="agent stopping"),
                                                          "n2": leaving_node("n2")}, now=1001.0, cfg=CFG)
    assert [x.node_id for x in elsewhere if isinstance(x, d.StartShard)] == ["n2"]
