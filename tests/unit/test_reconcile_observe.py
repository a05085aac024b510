"""Observe, stepped with plain data: what a placed replica's shards say moves its phase (``reconcile.observe``).

One-node replicas first, then groups (a replica over two nodes: Ready when every
rank is, replaced whole when one is lost), then replicas being removed
(``reconcile.terminating``).
"""

from __future__ import annotations

import dataclasses

from test_reconcile_data import (
    CFG,
    NOW,
    SPEC,
    S,
    commands,
    group,
    ib_node,
    one_node,
    rep,
    run,
    run_group,
    updates,
)

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Phase
from llmgw.control.status import summarize
from llmgw.core.shards import ShardState


def test_ready_shard_makes_replica_ready() -> None:
    """A Ready shard moves the replica to Ready with its endpoint, and resets failures."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-1", attempt=1, failures=2, started_at=990, sent_at=990)
    got = updates(run([r], [one_node(shards={"r1-1": ShardState.READY})]))["r1"]
    assert (got.phase, got.endpoint, got.failures) == (Phase.READY, "http://h:1", 0)


def test_nothing_changes_when_nothing_happened() -> None:
    """A Ready replica whose shard is Ready produces no decision at all."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1", message="serving on node n1")
    assert run([r], [one_node(shards={"r1-1": ShardState.READY})]) == []


def test_failed_shard_backs_off_then_replaces() -> None:
    """A failed shard puts the replica back to Pending with exponential backoff and the reason."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1)
    got = updates(run([r], [one_node(shards={"r1-1": ShardState.FAILED})]))["r1"]
    assert got.phase is Phase.PENDING and got.failures == 1 and got.next_attempt_at == 1002.0
    assert "boom" in got.message and "next try in 2s" in got.message
    # During the backoff nothing is started ...
    assert not [x for x in run([got], [one_node()], now=1001) if isinstance(x, d.StartShard)]
    # ... after it, a new attempt with a new shard id.
    starts = [x for x in run([got], [one_node()], now=1002.5) if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-2"]


def test_shard_stopped_on_its_node_is_replaced_without_backoff() -> None:
    """A shard its agent stopped (the agent shut down) is replaced at once and not counted as a failure."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1, endpoint="http://h:1")
    out = run([r], [one_node("n1", shards={"r1-1": ShardState.STOPPED})])
    got = updates(out)["r1"]
    assert got.failures == 0 and got.phase is Phase.STARTING and got.node_id == "n1"
    assert [x.spec.shard_id for x in out if isinstance(x, d.StartShard)] == ["r1-2"]


def test_backoff_grows_and_is_capped() -> None:
    """2, 4, 8 ... seconds, never past the cap."""
    assert [decide.backoff(n, CFG) for n in (0, 1, 2, 3, 10)] == [0, 2, 4, 8, 60]


def test_crash_loop_is_named() -> None:
    """After N failures in a row the message says crash loop."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-3", attempt=3, failures=2, started_at=999, sent_at=999)
    got = updates(run([r], [one_node(shards={"r1-3": ShardState.FAILED})]))["r1"]
    assert got.message.startswith("crash loop: failed 3 times in a row")


def test_startup_timeout_stops_and_replaces() -> None:
    """A shard Starting past the startup timeout is stopped and the replica goes back to Pending."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-1", attempt=1, started_at=800, sent_at=800)
    out = run([r], [one_node(shards={"r1-1": ShardState.STARTING})])
    assert d.StopShard("n1", "r1-1", "did not become ready within 100s") in out
    assert updates(out)["r1"].phase is Phase.PENDING


def test_lost_start_command_is_resent_with_the_same_shard_id() -> None:
    """A StartShard the agent never acted on is sent again, same id, after resend_s."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-1", attempt=1, started_at=980, sent_at=985)
    assert not [x for x in run([r], [one_node()], now=990) if isinstance(x, d.StartShard)]
    starts = [x for x in run([r], [one_node()], now=996) if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-1"]


def test_start_sent_before_the_node_reregistered_is_resent_at_once() -> None:
    """A StartShard sent on a stream that has since been replaced may be lost: send it again now."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-2", attempt=2, started_at=995, sent_at=995)
    n = one_node()
    n.registered_at = 998
    starts = [x for x in run([r], [n], now=999) if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-2"]


def test_start_resent_after_reregistration_restarts_the_startup_clock() -> None:
    """A replica placed long ago on a stream that died is not failed for a startup timeout it never had."""
    r = rep(Phase.STARTING, node_id="n1", shard_id="r1-5", attempt=5, started_at=10, sent_at=10)
    n = one_node()
    n.registered_at = 5000
    out = run([r], [n], now=5001)
    assert [x.spec.shard_id for x in out if isinstance(x, d.StartShard)] == ["r1-5"]
    got = updates(out)["r1"]
    assert got.phase is Phase.STARTING and got.started_at == 5001 and got.failures == 0


def test_disconnected_node_gets_a_grace_period() -> None:
    """Within the grace period nothing is re-placed; after it the replica moves elsewhere."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1")
    gone = one_node("n1", connected=False, since=980)
    inside = run([r], [gone, one_node("n2")], now=1000)
    assert not [x for x in inside if isinstance(x, d.StartShard)]
    after = run([r], [gone, one_node("n2")], now=1011)
    assert [x.node_id for x in after if isinstance(x, d.StartShard)] == ["n2"]


def test_what_a_node_said_before_it_left_counts() -> None:
    """An agent that reported its shard Stopped and then disconnected: replace now, not after the grace."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1, endpoint="http://h:1")
    left = one_node("n1", shards={"r1-1": ShardState.STOPPED})
    left.connected, left.disconnected_since = False, 999
    got = updates(run([r], [left]))["r1"]
    assert got.phase is Phase.PENDING and got.endpoint == "" and got.failures == 0


def test_restart_does_not_act_on_absence() -> None:
    """After a control plane restart, nodes not yet reconnected keep their replicas for the grace period."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1")
    unseen = one_node("n1", connected=False, since=1000)  # disconnected "since the control plane started"
    assert run([r], [unseen], now=1020) == [d.UpdateReplica(dataclasses.replace(
        r, message="node n1 is not connected; waiting up to 30s for it before placing elsewhere"))]


def test_reregistered_node_without_the_shard_replaces_it_without_backoff() -> None:
    """A node that registers without a Ready replica's shard: the engine is gone, start a new one now."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", attempt=1, endpoint="http://h:1")
    out = run([r], [one_node()])
    starts = [x for x in out if isinstance(x, d.StartShard)]
    assert [s.spec.shard_id for s in starts] == ["r1-2"]
    assert updates(out)["r1"].failures == 0


def test_adopted_engine_stays_ready_while_checked() -> None:
    """A Ready replica whose restarted agent reports its engine adopted and Starting stays Ready and routed."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1", started_at=0,
            message="serving on node n1")
    n = one_node(shards={"r1-1": ShardState.STARTING})
    n.shards["r1-1"] = dataclasses.replace(n.shards["r1-1"], adopted=True)
    assert run([r], [n], now=10_000) == []


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


def test_ready_only_when_every_rank_is_and_the_endpoint_is_the_leaders() -> None:
    """One rank Ready is not enough; both Ready make the replica Ready at the leader's endpoint."""
    half = run_group([group()], [ib_node("n1", shards={"r1-1-0": S.READY}),
                                 ib_node("n2", shards={"r1-1-1": S.STARTING})])
    r = updates(half)["r1"]
    assert r.phase is Phase.STARTING and r.endpoint == ""
    assert r.message.startswith("1 of 2 ranks ready; rank 1 starting on node n2")
    # The worker's shard belongs to a live group: never stopped as an orphan.
    assert not commands(half, d.StopShard)
    out = run_group([group()], [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY})])
    r = updates(out)["r1"]
    assert (r.phase, r.endpoint, r.failures) == (Phase.READY, "http://n1:8000", 0)
    assert not commands(out, d.StopShard)
    # Ready and unchanged: nothing more to do.
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY})]
    assert run_group([r], nodes) == []


def test_a_rank_never_heard_of_is_sent_again() -> None:
    """A StartShard for a rank that may have been lost is resent after resend_s, to that rank only."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.STARTING}), ib_node("n2")]
    assert not commands(run_group([group()], nodes, now=995), d.StartShard)
    out = run_group([group()], nodes, now=1001)
    starts = [x for x in out if isinstance(x, d.StartShard)]
    assert [(x.node_id, x.spec.shard_id, x.spec.rank) for x in starts] == [("n2", "r1-1-1", 1)]


def test_one_rank_failing_stops_every_rank_and_replaces_the_group_with_backoff() -> None:
    """The worker failed: the leader is stopped too, and the group waits out its backoff before a new attempt."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.FAILED})]
    out = run_group([group()], nodes)
    r = updates(out)["r1"]
    assert (r.phase, r.members, r.node_id, r.failures, r.next_attempt_at) == (Phase.PENDING, (), None, 1, NOW + 2)
    assert r.message.startswith("rank 1 on node n2 failed: boom; next try in 2s") and r.last_output == ("oom",)
    assert commands(out, d.StopShard) == [("n1", "r1-1-0")]
    assert not commands(out, d.StartShard)
    # After the backoff the whole group is placed again, under new shard ids.
    later = [ib_node("n1", shards={"r1-1-0": S.STOPPED}), ib_node("n2", shards={"r1-1-1": S.FAILED})]
    again = run_group([r], later, now=NOW + 3)
    assert commands(again, d.StartShard) == [("n1", "r1-2-0"), ("n2", "r1-2-1")]


def test_a_rank_failing_while_ready_takes_the_replica_out_of_service() -> None:
    """A Ready group whose leader failed is Pending (out of the router's table) and its worker is stopped."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.FAILED}), ib_node("n2", shards={"r1-1-1": S.READY})]
    out = run_group([group(Phase.READY, endpoint="http://n1:8000")], nodes)
    r = updates(out)["r1"]
    assert (r.phase, r.endpoint) == (Phase.PENDING, "")
    assert commands(out, d.StopShard) == [("n2", "r1-1-1")]


def test_a_rank_whose_node_is_lost_past_grace_replaces_the_group() -> None:
    """Within the grace the group waits, nothing stopped; past it the other ranks stop and it is placed again."""
    ready = group(Phase.READY, endpoint="http://n1:8000")
    lost = ib_node("n2", shards={"r1-1-1": S.READY}, connected=False, since=NOW - 10)
    out = run_group([ready], [ib_node("n1", shards={"r1-1-0": S.READY}), lost, ib_node("n3")])
    assert not commands(out, d.StopShard) and not commands(out, d.StartShard)
    r = updates(out)["r1"]
    assert r.phase is Phase.READY and r.message.startswith("node n2 (rank 1) is not connected; waiting up to 30s")
    lost = dataclasses.replace(lost, disconnected_since=NOW - 40)
    out = run_group([r], [ib_node("n1", shards={"r1-1-0": S.READY}), lost, ib_node("n3")])
    r = updates(out)["r1"]
    assert (r.phase, r.members, r.endpoint, r.failures) == (Phase.PENDING, (), "", 0)  # not the replica's failure
    assert r.message.startswith("node n2 (rank 1) lost for 40s; a group cannot lose a rank")
    assert commands(out, d.StopShard) == [("n1", "r1-1-0")]
    # The old leader gets backoff_base_s to exit (it holds n1's GPUs); then the group goes on n1 and n3.
    assert not commands(run_group([r], [ib_node("n1"), lost, ib_node("n3")], now=NOW + 1), d.StartShard)
    again = run_group([r], [ib_node("n1"), lost, ib_node("n3")], now=NOW + 2)
    assert commands(again, d.StartShard) == [("n1", "r1-2-0"), ("n3", "r1-2-1")]


def test_drain_that_never_finishes_is_cut_short() -> None:
    """A shard Draining past the drain timeout (plus the resend slack) is stopped anyway."""
    term = rep(Phase.TERMINATING, node_id="n1", shard_id="r1-1", sent_at=1000, message="bye")
    zero = {"m": dataclasses.replace(SPEC, replicas=0)}
    assert run([term], [one_node(shards={"r1-1": ShardState.DRAINING})], now=1039, models=zero) == []
    assert run([term], [one_node(shards={"r1-1": ShardState.DRAINING})], now=1041, models=zero) == [
        d.StopShard("n1", "r1-1", "bye (drain did not finish)")]


def test_deleting_a_ready_group_drains_the_leader_then_stops_every_rank() -> None:
    """Drain goes to the leader only; once it is drained every rank is stopped; gone once all have stopped."""
    ready = group(Phase.READY, endpoint="http://n1:8000")
    serving = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.READY})]
    out = run_group([ready], serving, models={})
    r = updates(out)["r1"]
    assert r.phase is Phase.TERMINATING
    assert commands(out, d.DrainShard) == [("n1", "r1-1-0")] and not commands(out, d.StopShard)
    draining = [ib_node("n1", shards={"r1-1-0": S.DRAINING}), ib_node("n2", shards={"r1-1-1": S.READY})]
    assert not commands(run_group([r], draining, now=NOW + 1, models={}), d.StopShard)
    drained = [ib_node("n1", shards={"r1-1-0": S.DRAINED}), ib_node("n2", shards={"r1-1-1": S.READY})]
    assert commands(run_group([r], drained, now=NOW + 2, models={}), d.StopShard) == [
        ("n1", "r1-1-0"), ("n2", "r1-1-1")]
    half = [ib_node("n1", shards={"r1-1-0": S.STOPPED}), ib_node("n2", shards={"r1-1-1": S.STOPPING})]
    assert d.DeleteReplica("r1") not in run_group([r], half, now=NOW + 3, models={})
    gone = [ib_node("n1", shards={"r1-1-0": S.STOPPED}), ib_node("n2", shards={"r1-1-1": S.STOPPED})]
    assert run_group([r], gone, now=NOW + 4, models={}) == [d.DeleteReplica("r1")]


def test_deleting_a_starting_group_stops_every_rank_at_once() -> None:
    """Nothing is served yet, so there is nothing to drain."""
    nodes = [ib_node("n1", shards={"r1-1-0": S.STARTING}), ib_node("n2", shards={"r1-1-1": S.READY})]
    out = run_group([group()], nodes, models={})
    assert commands(out, d.StopShard) == [("n1", "r1-1-0"), ("n2", "r1-1-1")] and not commands(out, d.DrainShard)
