"""Multi-node replicas in the reconciler, stepped with plain data: one shard per rank, started and failed together."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_placement_data import gpu, hca, ib_fabric, node, spec

from llmgw.control.placement import fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.control.store.store import Store
from llmgw.core.shards import ShardState, ShardStatus

S = ShardState
CFG = decide.Config(node_grace_s=30, resend_s=10, backoff_base_s=2, backoff_max_s=60, crash_loop_after=3)
SPEC = spec(gpus=2, nnodes=2)
FP = SPEC.fingerprint()
NOW = 1000.0


def ib_node(nid: str, fabric: str = "ib-a", *adapters: str, shards: dict[str, ShardState] | None = None,
            connected: bool = True, since: float = 0.0, gpus: int = 2, draining: bool = False) -> NodeView:
    adapters = adapters or ("mlx5_0",)
    v = node(nid, gpus=tuple(gpu(i) for i in range(gpus)), fabrics=(ib_fabric(fabric, *adapters),),
             hcas=tuple(hca(a) for a in adapters), mgmt_addr=f"10.0.0.{nid[-1]}", connected=connected)
    sts = {sid: ShardStatus(sid, "r1", st, endpoint=f"http://{nid}:8000", exit_code=3 if st is S.FAILED else None,
                            message="boom" if st is S.FAILED else "", last_output=("oom",) if st is S.FAILED else ())
           for sid, st in (shards or {}).items()}
    return dataclasses.replace(v, shards=sts, disconnected_since=since, draining=draining)


def group(phase: Phase = Phase.STARTING, *, attempt: int = 1, **kw: object) -> ReplicaRecord:
    """A group of two ranks on n1 (leader) and n2, as place_pending leaves it."""
    members = (Member(0, "n1", f"r1-{attempt}-0", (0, 1), ("mlx5_0",)),
               Member(1, "n2", f"r1-{attempt}-1", (0, 1), ("mlx5_0",)))
    base = ReplicaRecord("r1", "m", FP, phase, "k", node_id="n1", shard_id=f"r1-{attempt}-0", gpus=(0, 1),
                         attempt=attempt, started_at=990, sent_at=990, members=members, leader_addr="10.0.0.1",
                         leader_port=29500)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run(replicas: list[ReplicaRecord], nodes: list[NodeView], *, now: float = NOW,
        models: dict[str, object] | None = None) -> list[d.Decision]:
    return decide.reconcile({"m": SPEC} if models is None else models, replicas,  # type: ignore[arg-type]
                            {n.id: n for n in nodes}, now=now, cfg=CFG)


def updates(out: list[d.Decision]) -> dict[str, ReplicaRecord]:
    return {x.record.id: x.record for x in out if isinstance(x, d.UpdateReplica)}


def commands(out: list[d.Decision], kind: type) -> list[tuple[str, str]]:
    return [(x.node_id, x.spec.shard_id if isinstance(x, d.StartShard) else x.shard_id)  # type: ignore[attr-defined]
            for x in out if isinstance(x, kind)]


def test_a_pending_group_gets_one_shard_per_rank_on_one_fabric() -> None:
    """Two nodes of ib-a take the ranks (not the ib-b one); every StartShard names the leader; target first."""
    pending = ReplicaRecord("r1", "m", FP, Phase.PENDING, "k")
    out = run([pending], [ib_node("n1", "ib-a", "mlx5_0", "mlx5_1"), ib_node("n2", "ib-b"), ib_node("n3", "ib-a")])
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
    out = run([ReplicaRecord("r1", "m", FP, Phase.PENDING, "k")], [ib_node("n1"), ib_node("n2", "ib-b")])
    r = updates(out)["r1"]
    assert r.phase is Phase.PENDING and r.members == ()
    assert "no declared fabric has 2 nodes" in r.message
    assert not commands(out, d.StartShard)


def test_a_second_group_in_another_pass_gets_its_own_ports_and_gpus() -> None:
    """A placed group's GPUs (on every rank's node) and its leader's port are not given to the next."""
    nodes = [ib_node(f"n{i}", gpus=4) for i in (1, 2)]
    two = {"m": spec(gpus=2, nnodes=2, placement="binpack", replicas=2)}
    placed = group(fingerprint=two["m"].fingerprint())
    out = run([placed, ReplicaRecord("r2", "m", placed.fingerprint, Phase.PENDING, "k")], nodes, models=two)
    r2 = updates(out)["r2"]
    assert [(m.node_id, m.gpus) for m in r2.members] == [("n1", (2, 3)), ("n2", (2, 3))]
    assert r2.leader_port == 29501


def test_ready_only_when_every_rank_is_and_the_endpoint_is_the_leaders() -> None:
    """One rank Ready is not enough; both Ready make the replica Ready at the leader's endpoint."""
    half = run([group()], [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.STARTING})])
    r = updates(half)["r1"]
    assert r.phase is Phase.STARTING and r.endpoint == ""
    assert r.message.startswith("1 of 2 ranks ready; rank 1 starting on node n2")
    # The worker's shard belongs to a live group: never stopped as an orphan.
    assert not commands(half, d.StopShard)
    out = run([group()], [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY})])
    r = updates(out)["r1"]
    assert (r.phase, r.endpoint, r.failures) == (Phase.READY, "http://n1:8000", 0)
    assert not commands(out, d.StopShard)
    # Ready and unchanged: nothing more to do.
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY})]
    assert run([r], nodes) == []


def test_a_rank_never_heard_of_is_sent_again() -> None:
    """A StartShard for a rank that may have been lost is resent after resend_s, to that rank only."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.STARTING}), ib_node("n2")]
    assert not commands(run([group()], nodes, now=995), d.StartShard)
    out = run([group()], nodes, now=1001)
    starts = [x for x in out if isinstance(x, d.StartShard)]
    assert [(x.node_id, x.spec.shard_id, x.spec.rank) for x in starts] == [("n2", "r1-1-1", 1)]


def test_one_rank_failing_stops_every_rank_and_replaces_the_group_with_backoff() -> None:
    """The worker failed: the leader is stopped too, and the group waits out its backoff before a new attempt."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.FAILED})]
    out = run([group()], nodes)
    r = updates(out)["r1"]
    assert (r.phase, r.members, r.node_id, r.failures, r.next_attempt_at) == (Phase.PENDING, (), None, 1, NOW + 2)
    assert r.message.startswith("rank 1 on node n2 failed: boom; next try in 2s") and r.last_output == ("oom",)
    assert commands(out, d.StopShard) == [("n1", "r1-1-0")]
    assert not commands(out, d.StartShard)
    # After the backoff the whole group is placed again, under new shard ids.
    later = [ib_node("n1", shards={"r1-1-0": S.STOPPED}), ib_node("n2", shards={"r1-1-1": S.FAILED})]
    again = run([r], later, now=NOW + 3)
    assert commands(again, d.StartShard) == [("n1", "r1-2-0"), ("n2", "r1-2-1")]


def test_a_rank_failing_while_ready_takes_the_replica_out_of_service() -> None:
    """A Ready group whose leader failed is Pending (out of the router's table) and its worker is stopped."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.FAILED}), ib_node("n2", shards={"r1-1-1": S.READY})]
    out = run([group(Phase.READY, endpoint="http://n1:8000")], nodes)
    r = updates(out)["r1"]
    assert (r.phase, r.endpoint) == (Phase.PENDING, "")
    assert commands(out, d.StopShard) == [("n2", "r1-1-1")]


def test_a_rank_whose_node_is_lost_past_grace_replaces_the_group() -> None:
    """Within the grace the group waits, nothing stopped; past it the other ranks stop and it is placed again."""
    ready = group(Phase.READY, endpoint="http://n1:8000")
    lost = ib_node("n2", shards={"r1-1-1": S.READY}, connected=False, since=NOW - 10)
    out = run([ready], [ib_node("n1", shards={"r1-1-0": S.READY}), lost, ib_node("n3")])
    assert not commands(out, d.StopShard) and not commands(out, d.StartShard)
    r = updates(out)["r1"]
    assert r.phase is Phase.READY and r.message.startswith("node n2 (rank 1) is not connected; waiting up to 30s")
    lost = dataclasses.replace(lost, disconnected_since=NOW - 40)
    out = run([r], [ib_node("n1", shards={"r1-1-0": S.READY}), lost, ib_node("n3")])
    r = updates(out)["r1"]
    assert (r.phase, r.members, r.endpoint, r.failures) == (Phase.PENDING, (), "", 0)  # not the replica's failure
    assert r.message.startswith("node n2 (rank 1) lost for 40s; a group cannot lose a rank")
    assert commands(out, d.StopShard) == [("n1", "r1-1-0")]
    # The old leader gets backoff_base_s to exit (it holds n1's GPUs); then the group goes on n1 and n3.
    assert not commands(run([r], [ib_node("n1"), lost, ib_node("n3")], now=NOW + 1), d.StartShard)
    again = run([r], [ib_node("n1"), lost, ib_node("n3")], now=NOW + 2)
    assert commands(again, d.StartShard) == [("n1", "r1-2-0"), ("n3", "r1-2-1")]


def test_deleting_a_ready_group_drains_the_leader_then_stops_every_rank() -> None:
    """Drain goes to the leader only; once it is drained every rank is stopped; gone once all have stopped."""
    ready = group(Phase.READY, endpoint="http://n1:8000")
    serving = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY})]
    out = run([ready], serving, models={})
    r = updates(out)["r1"]
    assert r.phase is Phase.TERMINATING
    assert commands(out, d.DrainShard) == [("n1", "r1-1-0")] and not commands(out, d.StopShard)
    draining = [ib_node("n1", shards={"r1-1-0": S.DRAINING}), ib_node("n2", shards={"r1-1-1": S.READY})]
    assert not commands(run([r], draining, now=NOW + 1, models={}), d.StopShard)
    drained = [ib_node("n1", shards={"r1-1-0": S.DRAINED}), ib_node("n2", shards={"r1-1-1": S.READY})]
    assert commands(run([r], drained, now=NOW + 2, models={}), d.StopShard) == [("n1", "r1-1-0"), ("n2", "r1-1-1")]
    half = [ib_node("n1", shards={"r1-1-0": S.STOPPED}), ib_node("n2", shards={"r1-1-1": S.STOPPING})]
    assert d.DeleteReplica("r1") not in run([r], half, now=NOW + 3, models={})
    gone = [ib_node("n1", shards={"r1-1-0": S.STOPPED}), ib_node("n2", shards={"r1-1-1": S.STOPPED})]
    assert run([r], gone, now=NOW + 4, models={}) == [d.DeleteReplica("r1")]


def test_deleting_a_starting_group_stops_every_rank_at_once() -> None:
    """Nothing is served yet, so there is nothing to drain."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.STARTING}), ib_node("n2", shards={"r1-1-1": S.READY})]
    out = run([group()], nodes, models={})
    assert commands(out, d.StopShard) == [("n1", "r1-1-0"), ("n2", "r1-1-1")] and not commands(out, d.DrainShard)


def test_a_rank_on_a_draining_node_rolls_the_whole_group() -> None:
    """A group with a rank on a node being drained is replaced (surge first), like a one-node replica."""
    ready = group(Phase.READY, endpoint="http://n1:8000")
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY}, draining=True),
             ib_node("n3")]
    out = run([ready], nodes)
    assert [x for x in out if isinstance(x, d.CreateReplica)] == [d.CreateReplica("m", FP)]


def test_the_ledger_counts_each_rank_on_its_own_node() -> None:
    """GPUs and threads of a group are held on every member's node, not all on the leader's."""
    threaded = {"m": dataclasses.replace(SPEC, resources=dataclasses.replace(SPEC.resources, cpu_threads=3))}
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
