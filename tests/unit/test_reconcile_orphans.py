"""Orphans, stepped with plain data: a live shard no replica wants is stopped, once, and only where it is known."""

from __future__ import annotations

from test_reconcile_data import GROUP_SPEC, S, group, ib_node, one_node, rep, run, run_group

from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Phase
from llmgw.core.shards import ShardState


def test_orphan_shards_are_stopped() -> None:
    """A live shard that no replica wants (an old attempt, a node that came back) is stopped."""
    r = rep(Phase.READY, node_id="n1", shard_id="r1-2", endpoint="http://h:1", message="serving on node n1")
    out = run([r], [one_node(shards={"r1-2": ShardState.READY, "r1-1": ShardState.READY, "x-1": ShardState.FAILED})])
    assert out == [d.StopShard("n1", "r1-1", "no replica wants this shard")]


def test_shards_on_a_node_not_connected_or_not_reported_are_left_alone() -> None:
    """What a node is running is known only once it registered with this control plane: nothing is stopped before."""
    gone = one_node("n1", shards={"x-1": ShardState.READY}, connected=False, since=999)
    assert run([], [gone], models={}) == []
    unreported = one_node("n1", shards={"x-1": ShardState.READY})
    unreported.reported = False
    assert run([], [unreported], models={}) == []


def test_a_shard_stopping_or_already_asked_to_stop_is_not_asked_again() -> None:
    """A Stopping orphan is on its way; a rank the pass already stops (its group failed) gets one StopShard."""
    assert run([], [one_node("n1", shards={"x-1": ShardState.STOPPING})], models={}) == []
    nodes = [ib_node("n1", shards={"r1-1-0": S.READY}), ib_node("n2", shards={"r1-1-1": S.FAILED})]
    out = run_group([group()], nodes, models={"m": GROUP_SPEC})
    assert [(x.node_id, x.shard_id) for x in out if isinstance(x, d.StopShard)] == [("n1", "r1-1-0")]
