"""Rolling updates and node drains, stepped with plain data: a toy world carries each pass's decisions out.

The world is as simple as the reconciler's contract allows: a started shard is
Ready at the next pass, a drained one Drained, a stopped one Stopped. Every
pass is checked against the two bounds a roll promises.
"""

from __future__ import annotations

import dataclasses

from test_reconcile_data import FP, GROUP_FP, SPEC, group, ib_node, one_node, rep, run, run_group, updates

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec, Rollout

CFG = decide.Config(node_grace_s=30, resend_s=10, backoff_base_s=2, backoff_max_s=60, crash_loop_after=3)
S = ShardState


def spec(replicas: int = 4, *, surge: str = "1", unavailable: str = "0", args: tuple[str, ...] = ()) -> ModelSpec:
    return ModelSpec(engine="sim", served_name="m", replicas=replicas, engine_args=args,
                     rollout=Rollout(max_surge=surge, max_unavailable=unavailable))


def node(nid: str, **kw: object) -> NodeView:
    inv = Inventory(cpu_count=64, memory_total_bytes=64 << 30, memory_available_bytes=60 << 30,
                    engines=(("sim", "1"),))
    return NodeView(nid, inv, connected=True, reported=True, **kw)  # type: ignore[arg-type]


class World:
    def __init__(self, nodes: list[NodeView]) -> None:
        self.nodes = {n.id: n for n in nodes}
        self.replicas: dict[str, ReplicaRecord] = {}
        self.now = 1000.0
        self.seq = 0
        self.log: list[d.Decision] = []

    def step(self, models: dict[str, ModelSpec]) -> list[d.Decision]:
        # The agents act on what was sent last pass.
        for n in self.nodes.values():
            for sid, st in list(n.shards.items()):
                nxt = {S.STARTING: S.READY, S.DRAINING: S.DRAINED, S.STOPPING: S.STOPPED}.get(st.state)
                if nxt is not None:
                    n.shards[sid] = dataclasses.replace(st, state=nxt, endpoint=f"http://{n.id}/{sid}")
        self.now += 1
        out = decide.reconcile(models, list(self.replicas.values()), self.nodes, now=self.now, cfg=CFG)
        for dec in out:
            if isinstance(dec, d.UpdateReplica):
                self.replicas[dec.record.id] = dec.record
            elif isinstance(dec, d.DeleteReplica):
                del self.replicas[dec.replica_id]
            elif isinstance(dec, d.CreateReplica):
                self.seq += 1
                rid = f"r{self.seq}"
                self.replicas[rid] = ReplicaRecord(rid, dec.model, dec.fingerprint, Phase.PENDING, "k",
                                                   created_at=self.now)
            elif isinstance(dec, d.StartShard):
                self.nodes[dec.node_id].shards[dec.spec.shard_id] = ShardStatus(
                    dec.spec.shard_id, dec.spec.replica_id, S.STARTING)
            elif isinstance(dec, d.DrainShard):
                self.set(dec.node_id, dec.shard_id, S.DRAINING)
            elif isinstance(dec, d.StopShard):
                self.set(dec.node_id, dec.shard_id, S.STOPPING)
        self.log += out
        return out

    def set(self, node_id: str, shard_id: str, state: ShardState) -> None:
        n = self.nodes[node_id]
        n.shards[shard_id] = dataclasses.replace(n.shards[shard_id], state=state)

    def ready(self) -> list[ReplicaRecord]:
        return [r for r in self.replicas.values() if r.phase is Phase.READY]

    def settle(self, models: dict[str, ModelSpec], *, passes: int = 60) -> None:
        for _ in range(passes):
            if not self.step(models) and all(r.phase is Phase.READY for r in self.replicas.values()):
                return
        raise AssertionError(f"not settled: {self.replicas}")


def roll(old: ModelSpec, new: ModelSpec, *, nodes: int = 2) -> tuple[World, list[tuple[int, int]]]:
    """Settles ``old``, applies ``new``, and records (placed, Ready) after every pass of the roll."""
    w = World([node(f"n{i}") for i in range(1, nodes + 1)])
    w.settle({"m": old})
    seen: list[tuple[int, int]] = []
    for _ in range(100):
        out = w.step({"m": new})
        placed = sum(1 for r in w.replicas.values() if r.phase is not Phase.PENDING or r.node_id)
        seen.append((len(w.replicas), len(w.ready())))
        assert placed <= len(w.replicas)
        if not out and all(r.phase is Phase.READY and r.fingerprint == new.fingerprint()
                           for r in w.replicas.values()) and len(w.replicas) == new.replicas:
            return w, seen
    raise AssertionError(f"roll did not finish: {w.replicas}")


def test_default_roll_is_one_at_a_time_and_never_below_replicas_ready() -> None:
    """max_surge 1, max_unavailable 0: never more than 5 replicas, never fewer than 4 Ready, all end new."""
    w, seen = roll(spec(), spec(args=("--x",)))
    assert max(total for total, _ in seen) == 5
    assert min(ready for _, ready in seen) >= 4
    assert {r.fingerprint for r in w.replicas.values()} == {spec(args=("--x",)).fingerprint()}


def test_old_replica_is_drained_only_after_its_replacement_is_ready() -> None:
    """The sequence: create new, new Ready, drain an old one, stop it once Drained, then the next new one."""
    w = World([node("n1")])
    old, new = spec(2), spec(2, args=("--x",))
    w.settle({"m": old})
    olds = set(w.replicas)
    first = w.step({"m": new})
    assert [x for x in first if isinstance(x, d.CreateReplica)] == [d.CreateReplica("m", new.fingerprint())]
    assert not [x for x in first if isinstance(x, d.DrainShard | d.StopShard)]
    kinds = [type(x).__name__ for x in w.step({"m": new}) if not isinstance(x, d.UpdateReplica)]
    assert kinds == ["StartShard"]  # placed; not Ready yet, so nothing old is touched
    drains = [x for x in w.step({"m": new}) if isinstance(x, d.DrainShard)]  # new one Ready now
    assert len(drains) == 1 and drains[0].shard_id.rsplit("-", 1)[0] in olds
    stops = [x for x in w.step({"m": new}) if isinstance(x, d.StopShard)]
    assert [s.shard_id for s in stops] == [drains[0].shard_id]


def test_max_unavailable_without_surge_stops_first() -> None:
    """max_surge 0, max_unavailable 1: never more than 4 replicas, never fewer than 3 Ready."""
    _, seen = roll(spec(surge="0", unavailable="1"), spec(surge="0", unavailable="1", args=("--x",)))
    assert max(total for total, _ in seen) <= 4
    assert min(ready for _, ready in seen) == 3


def test_shares_round_surge_up_and_unavailable_down() -> None:
    """25% of 4 is one each way; 50% surge of 4 lets two new replicas start at once."""
    assert (Rollout("25%", "25%").surge(4), Rollout("25%", "25%").unavailable(4)) == (1, 1)
    assert (Rollout("10%", "10%").surge(4), Rollout("10%", "10%").unavailable(4)) == (1, 0)
    assert Rollout("0", "0").surge(4) == 1  # a roll that could neither add nor remove would never start
    _, seen = roll(spec(surge="50%"), spec(surge="50%", args=("--x",)))
    assert max(total for total, _ in seen) == 6 and min(ready for _, ready in seen) >= 4


def test_rollout_bounds_are_not_part_of_the_fingerprint() -> None:
    """Changing only the rollout bounds rolls nothing."""
    assert spec(surge="3").fingerprint() == spec().fingerprint()
    w = World([node("n1")])
    w.settle({"m": spec()})
    assert w.step({"m": spec(surge="3", unavailable="2")}) == []


def test_outdated_replicas_not_serving_are_replaced_at_once() -> None:
    """An old replica that is not Ready (crash-looping, say) is terminated without waiting for the roll."""
    w = World([node("n1")])
    old = spec(2)
    w.settle({"m": old})
    broken = next(iter(w.replicas.values()))
    w.replicas[broken.id] = dataclasses.replace(broken, phase=Phase.PENDING, node_id=None, shard_id=None,
                                                failures=4, next_attempt_at=9e9)
    out = w.step({"m": spec(2, args=("--x",))})
    assert d.DeleteReplica(broken.id) in out
    # Two new ones at once: with the Ready old one that makes 3, replicas + max_surge.
    assert len([x for x in out if isinstance(x, d.CreateReplica)]) == 2


def test_a_new_spec_that_never_gets_ready_leaves_the_old_replicas_serving() -> None:
    """If the new replicas crash, the roll stops at the surge and every old replica keeps serving."""
    w = World([node("n1")])
    w.settle({"m": spec()})
    new = spec(args=("--broken",))
    failed: set[str] = set()
    for _ in range(10):
        w.step({"m": new})
        for n in w.nodes.values():  # every new shard fails as soon as it starts
            for sid, st in list(n.shards.items()):
                r = w.replicas.get(st.replica_id)
                if r is not None and r.fingerprint == new.fingerprint() and st.state is S.STARTING:
                    n.shards[sid] = dataclasses.replace(st, state=S.FAILED, message="boom")
                    failed.add(sid)
        assert len(w.ready()) == 4 and all(r.fingerprint == spec().fingerprint() for r in w.ready())
        assert len(w.replicas) <= 5
    # The roll did start, and kept trying: a roll that never began would have passed the checks above.
    assert len(failed) >= 2, failed


def test_drained_node_moves_its_replicas_and_keeps_them_ready() -> None:
    """Draining a node moves its replicas elsewhere one at a time, never below the Ready count."""
    w = World([node("n1"), node("n2")])
    m = {"m": spec(4)}
    w.settle(m)
    assert {r.node_id for r in w.replicas.values()} == {"n1", "n2"}
    w.nodes["n1"].cordoned = w.nodes["n1"].draining = True
    for _ in range(40):
        w.step(m)
        assert len(w.ready()) >= 4 and len(w.replicas) <= 5
    assert {r.node_id for r in w.replicas.values()} == {"n2"} and len(w.ready()) == 4
    assert not [s for s in w.nodes["n1"].shards.values() if s.state in S.live()]


def test_drain_with_nowhere_to_go_keeps_serving() -> None:
    """A drain on the only node starts a replacement that cannot be placed; the old replica keeps serving."""
    w = World([node("n1")])
    m = {"m": spec(1)}
    w.settle(m)
    (old,) = w.replicas.values()
    w.nodes["n1"].cordoned = w.nodes["n1"].draining = True
    for _ in range(5):
        w.step(m)
    assert w.replicas[old.id].phase is Phase.READY
    assert not [x for x in w.log if isinstance(x, d.DrainShard | d.StopShard)]


# -- counts and spec changes, one pass at a time ---------------------------------------------
def test_missing_replicas_are_created() -> None:
    """A model with no replicas gets CreateReplica decisions, one per missing replica."""
    out = run([], [one_node()], models={"m": dataclasses.replace(SPEC, replicas=2)})
    assert out == [d.CreateReplica("m", FP), d.CreateReplica("m", FP)]


def test_scale_down_and_delete() -> None:
    """Extra replicas are terminated (Pending ones first) and removed once their shard is gone."""
    spec0 = dataclasses.replace(SPEC, replicas=1)
    ready = rep(Phase.READY, id="r1", node_id="n1", shard_id="r1-1", endpoint="e", created_at=1)
    pending = rep(Phase.PENDING, id="r2", created_at=2)
    out = run([ready, pending], [one_node(shards={"r1-1": ShardState.READY})], models={"m": spec0})
    assert d.DeleteReplica("r2") in out and not [x for x in out if isinstance(x, d.StopShard)]
    # Model deleted: the Ready one is drained, stopped once Drained, deleted once Stopped.
    out = run([ready], [one_node(shards={"r1-1": ShardState.READY})], models={})
    assert d.DrainShard("n1", "r1-1", 30) in out and not [x for x in out if isinstance(x, d.StopShard)]
    term = updates(out)["r1"]
    assert term.phase is Phase.TERMINATING
    assert run([term], [one_node(shards={"r1-1": ShardState.DRAINING})], models={}, now=1005) == []
    assert run([term], [one_node(shards={"r1-1": ShardState.DRAINED})], models={}) == [
        d.StopShard("n1", "r1-1", "model m was deleted")]
    assert run([term], [one_node(shards={"r1-1": ShardState.STOPPED})], models={}) == [d.DeleteReplica("r1")]


def test_spec_change_keeps_old_replica_until_new_one_is_ready() -> None:
    """An edited model gets a new replica first; the old one is stopped only when the new one is Ready."""
    old = rep(Phase.READY, id="old", fingerprint="stale", node_id="n1", shard_id="old-1", endpoint="e")
    out = run([old], [one_node(shards={"old-1": ShardState.READY})])
    assert d.CreateReplica("m", FP) in out and not [x for x in out if isinstance(x, d.StopShard)]
    new = rep(Phase.READY, id="new", node_id="n1", shard_id="new-1", endpoint="e2")
    out = run([old, new], [one_node(shards={"old-1": ShardState.READY, "new-1": ShardState.READY})])
    assert d.DrainShard("n1", "old-1", 30) in out


def test_a_rank_on_a_draining_node_rolls_the_whole_group() -> None:
    """A group with a rank on a node being drained is replaced (surge first), like a one-node replica."""
    ready = group(Phase.READY, endpoint="http://n1:8000")
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY}, draining=True),
             ib_node("n3")]
    out = run_group([ready], nodes)
    assert [x for x in out if isinstance(x, d.CreateReplica)] == [d.CreateReplica("m", GROUP_FP)]
