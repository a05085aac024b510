"""The reconciler, stepped with plain data: what it decides for each situation."""

from __future__ import annotations

import dataclasses

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.status import summarize
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec

CFG = decide.Config(node_grace_s=30, resend_s=10, backoff_base_s=2, backoff_max_s=60, crash_loop_after=3)
SPEC = ModelSpec(engine="sim", served_name="m", startup_timeout_s=100)
FP = SPEC.fingerprint()


def node(nid: str = "n1", *, shards: dict[str, ShardState] | None = None, connected: bool = True,
         since: float = 0.0) -> NodeView:
    inv = Inventory(cpu_count=4, memory_total_bytes=8 << 30, memory_available_bytes=4 << 30,
                    engines=(("sim", "1"),))
    sts = {sid: ShardStatus(sid, sid.rsplit("-", 1)[0], st, endpoint="http://h:1", exit_code=3
                            if st is ShardState.FAILED else None, message="boom" if st is ShardState.FAILED else "")
           for sid, st in (shards or {}).items()}
    return NodeView(nid, inv, connected=connected, disconnected_since=since, shards=sts, reported=connected)


def rep(phase: Phase = Phase.PENDING, **kw: object) -> ReplicaRecord:
    base = ReplicaRecord(id="r1", model="m", fingerprint=FP, phase=phase, api_key="k")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run(replicas: list[ReplicaRecord], nodes: list[NodeView], *, now: float = 1000.0,
        models: dict[str, ModelSpec] | None = None) -> list[d.Decision]:
    return decide.reconcile({"m": SPEC} if models is None else models, replicas, {n.id: n for n in nodes},
                            now=now, cfg=CFG)


def updates(out: list[d.Decision]) -> dict[str, ReplicaRecord]:
    return {x.record.id: x.record for x in out if isinstance(x, d.UpdateReplica)}


def test_missing_replicas_are_created() -> None:
    """A model with no replicas gets CreateReplica decisions, one per missing replica."""
    out = run([], [node()], models={"m": dataclasses.replace(SPEC, replicas=2)})
    assert out == [d.CreateReplica("m", FP), d.CreateReplica("m", FP)]


def test_pending_replica_is_placed_and_started_target_first() -> None:
    """A pending replica gets a node and a shard id; the target is written before the command."""
    out = run([rep()], [node()])
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


def test_ready_shard_makes_replica_ready() -> None:
    """A Ready shard moves the replica to Ready with its endpoint, and resets failures."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-1", attempt=1, failures=2, started_at=990, sent_at=990)
    got = updates(run([r], [node(shards={"r1-1": ShardState.READY})]))["r1"]
    assert (got.phase, got.endpoint, got.failures) == (Phase.READY, "http://h:1", 0)


def test_nothing_changes_when_nothing_happened() -> None:
    """A Ready replica whose shard is Ready produces no decision at all."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1", message="serving on node n1")
    assert run([r], [node(shards={"r1-1": ShardState.READY})]) == []


def test_failed_shard_backs_off_then_replaces() -> None:
    """A failed shard puts the replica back to Pending with exponential backoff and the reason."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1)
    got = updates(run([r], [node(shards={"r1-1": ShardState.FAILED})]))["r1"]
    assert got.phase is Phase.PENDING and got.failures == 1 and got.next_attempt_at == 1002.0
    assert "boom" in got.message and "next try in 2s" in got.message
    # During the backoff nothing is started ...
    assert not [x for x in run([got], [node()], now=1001) if isinstance(x, d.StartShard)]
    # ... after it, a new attempt with a new shard id.
    starts = [x for x in run([got], [node()], now=1002.5) if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-2"]


def test_shard_stopped_on_its_node_is_replaced_without_backoff() -> None:
    """A shard its agent stopped (the agent shut down) is replaced at once and not counted as a failure."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1, endpoint="http://h:1")
    out = run([r], [node("n1", shards={"r1-1": ShardState.STOPPED})])
    got = updates(out)["r1"]
    assert got.failures == 0 and got.phase is Phase.STARTING and got.node_id == "n1"
    assert [x.spec.shard_id for x in out if isinstance(x, d.StartShard)] == ["r1-2"]


def test_backoff_grows_and_is_capped() -> None:
    """2, 4, 8 ... seconds, never past the cap."""
    assert [decide.backoff(n, CFG) for n in (0, 1, 2, 3, 10)] == [0, 2, 4, 8, 60]


def test_crash_loop_is_named() -> None:
    """After N failures in a row the message says crash loop."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-3", attempt=3, failures=2, started_at=999, sent_at=999)
    got = updates(run([r], [node(shards={"r1-3": ShardState.FAILED})]))["r1"]
    assert got.message.startswith("crash loop: failed 3 times in a row")


def test_startup_timeout_stops_and_replaces() -> None:
    """A shard Starting past the startup timeout is stopped and the replica goes back to Pending."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-1", attempt=1, started_at=800, sent_at=800)
    out = run([r], [node(shards={"r1-1": ShardState.STARTING})])
    assert d.StopShard("n1", "r1-1", "did not become ready within 100s") in out
    assert updates(out)["r1"].phase is Phase.PENDING


def test_lost_start_command_is_resent_with_the_same_shard_id() -> None:
    """A StartShard the agent never acted on is sent again, same id, after resend_s."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-1", attempt=1, started_at=980, sent_at=985)
    assert not [x for x in run([r], [node()], now=990) if isinstance(x, d.StartShard)]
    starts = [x for x in run([r], [node()], now=996) if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-1"]


def test_start_sent_before_the_node_reregistered_is_resent_at_once() -> None:
    """A StartShard sent on a stream that has since been replaced may be lost: send it again now."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-2", attempt=2, started_at=995, sent_at=995)
    n = node()
    n.registered_at = 998
    starts = [x for x in run([r], [n], now=999) if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-2"]


def test_start_resent_after_reregistration_restarts_the_startup_clock() -> None:
    """A replica placed long ago on a stream that died is not failed for a startup timeout it never had."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-5", attempt=5, started_at=10, sent_at=10)
    n = node()
    n.registered_at = 5000
    out = run([r], [n], now=5001)
    assert [x.spec.shard_id for x in out if isinstance(x, d.StartShard)] == ["r1-5"]
    got = updates(out)["r1"]
    assert got.phase is Phase.STARTING and got.started_at == 5001 and got.failures == 0


def test_disconnected_node_gets_a_grace_period() -> None:
    """Within the grace period nothing is re-placed; after it the replica moves elsewhere."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1")
    gone = node("n1", connected=False, since=980)
    inside = run([r], [gone, node("n2")], now=1000)
    assert not [x for x in inside if isinstance(x, d.StartShard)]
    after = run([r], [gone, node("n2")], now=1011)
    assert [x.node_id for x in after if isinstance(x, d.StartShard)] == ["n2"]


def test_what_a_node_said_before_it_left_counts() -> None:
    """An agent that reported its shard Stopped and then disconnected: replace now, not after the grace."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1, endpoint="http://h:1")
    left = node("n1", shards={"r1-1": ShardState.STOPPED})
    left.connected, left.disconnected_since = False, 999
    got = updates(run([r], [left]))["r1"]
    assert got.phase is Phase.PENDING and got.endpoint == "" and got.failures == 0


def test_restart_does_not_act_on_absence() -> None:
    """After a control plane restart, nodes not yet reconnected keep their replicas for the grace period."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1")
    unseen = node("n1", connected=False, since=1000)  # disconnected "since the control plane started"
    assert run([r], [unseen], now=1020) == [d.UpdateReplica(dataclasses.replace(
        r, message="node n1 is not connected; waiting up to 30s for it before placing elsewhere"))]


def test_reregistered_node_without_the_shard_replaces_it_without_backoff() -> None:
    """A node that registers without a Ready replica's shard: the engine is gone, start a new one now."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1, endpoint="http://h:1")
    out = run([r], [node()])
    starts = [x for x in out if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-2"]
    assert updates(out)["r1"].failures == 0


def test_orphan_shards_are_stopped() -> None:
    """A live shard that no replica wants (an old attempt, a node that came back) is stopped."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-2", endpoint="http://h:1", message="serving on node n1")
    out = run([r], [node(shards={"r1-2": ShardState.READY, "r1-1": ShardState.READY, "x-1": ShardState.FAILED})])
    assert out == [d.StopShard("n1", "r1-1", "no replica wants this shard")]


def test_scale_down_and_delete() -> None:
    """Extra replicas are terminated (Pending ones first) and removed once their shard is gone."""
    spec0 = dataclasses.replace(SPEC, replicas=1)
    ready = rep(Phase.READY, id="r1", node_id="n1", shard_id="r1-1", endpoint="e", created_at=1)
    pending = rep(Phase.PENDING, id="r2", created_at=2)
    out = run([ready, pending], [node(shards={"r1-1": ShardState.READY})], models={"m": spec0})
    assert d.DeleteReplica("r2") in out and not [x for x in out if isinstance(x, d.StopShard)]
    # Model deleted: the Ready one is drained, stopped once Drained, deleted once Stopped.
    out = run([ready], [node(shards={"r1-1": ShardState.READY})], models={})
    assert d.DrainShard("n1", "r1-1", 30) in out and not [x for x in out if isinstance(x, d.StopShard)]
    term = updates(out)["r1"]
    assert term.phase is Phase.TERMINATING
    assert run([term], [node(shards={"r1-1": ShardState.DRAINING})], models={}, now=1005) == []
    assert run([term], [node(shards={"r1-1": ShardState.DRAINED})], models={}) == [
        d.StopShard("n1", "r1-1", "model m was deleted")]
    assert run([term], [node(shards={"r1-1": ShardState.STOPPED})], models={}) == [d.DeleteReplica("r1")]


def test_drain_that_never_finishes_is_cut_short() -> None:
    """A shard Draining past the drain timeout (plus the resend slack) is stopped anyway."""
    term = rep(Phase.TERMINATING, node_id="n1", shard_id="r1-1", sent_at=1000, message="bye")
    zero = {"m": dataclasses.replace(SPEC, replicas=0)}
    assert run([term], [node(shards={"r1-1": ShardState.DRAINING})], now=1039, models=zero) == []
    assert run([term], [node(shards={"r1-1": ShardState.DRAINING})], now=1041, models=zero) == [
        d.StopShard("n1", "r1-1", "bye (drain did not finish)")]


def test_adopted_engine_stays_ready_while_checked() -> None:
    """A Ready replica whose restarted agent reports its engine adopted and Starting stays Ready and routed."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1", started_at=0,
            message="serving on node n1")
    n = node(shards={"r1-1": ShardState.STARTING})
    n.shards["r1-1"] = dataclasses.replace(n.shards["r1-1"], adopted=True)
    assert run([r], [n], now=10_000) == []


def test_spec_change_keeps_old_replica_until_new_one_is_ready() -> None:
    """An edited model gets a new replica first; the old one is stopped only when the new one is Ready."""
    old = rep(Phase.READY, id="old", fingerprint="stale", node_id="n1", shard_id="old-1", endpoint="e")
    out = run([old], [node(shards={"old-1": ShardState.READY})])
    assert d.CreateReplica("m", FP) in out and not [x for x in out if isinstance(x, d.StopShard)]
    new = rep(Phase.READY, id="new", node_id="n1", shard_id="new-1", endpoint="e2")
    out = run([old, new], [node(shards={"old-1": ShardState.READY, "new-1": ShardState.READY})])
    assert d.DrainShard("n1", "old-1", 30) in out


def test_summary_words_and_sentence() -> None:
    """The model's state word and the sentence the router puts in a 503."""
    starting = rep(Phase.STARTING, node_id="n1", started_at=988)
    st = summarize(SPEC, [starting], now=1000)
    assert st.state == "Starting" and st.message == "0 of 1 replicas Ready: replica r1 Starting on node n1 for 12s"
    assert summarize(SPEC, [rep(Phase.READY)], now=0).state == "Ready"
    assert summarize(SPEC, [rep(failures=1, message="x")], now=0).state == "Failed"
    assert summarize(dataclasses.replace(SPEC, replicas=0), [], now=0).state == "ScaledToZero"
    two = dataclasses.replace(SPEC, replicas=2)
    assert summarize(two, [rep(Phase.READY), rep(id="r2")], now=0).state == "Degraded"
