"""A ready replica whose engine holds another adapter list than its model's spec is sent a StartShard for the same
shard (the agent loads and unloads at runtime); never one of an old fingerprint, never when the lists agree."""

from __future__ import annotations

import dataclasses

from test_reconcile_data import CFG, NOW, one_node, rep

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile.shardspec import shard_spec
from llmgw.control.state import Phase
from llmgw.core.adapters import Adapter
from llmgw.core.shards import ShardState
from llmgw.core.specs import ModelSpec

A, B = Adapter("a", "file:///srv/a"), Adapter("b", "file:///srv/b")
SPEC = ModelSpec(engine="sim", served_name="m", startup_timeout_s=100, adapters=(A, B))


def decided(spec: ModelSpec, told: tuple[Adapter, ...], *, fingerprint: str | None = None) -> list[d.Decision]:
    r = rep(Phase.READY, node_id="n1", shard_id="r1-1", endpoint="http://h:1", message="serving on node n1",
            fingerprint=fingerprint or spec.fingerprint())
    node = one_node(shards={"r1-1": ShardState.READY})
    st = node.shards["r1-1"]
    node.shards["r1-1"] = dataclasses.replace(st, spec=dataclasses.replace(shard_spec(r, spec), adapters=told))
    return decide.reconcile({"m": spec}, [r], {node.id: node}, now=NOW, cfg=CFG)


def test_a_changed_list_is_sent_to_the_same_shard() -> None:
    starts = [x for x in decided(SPEC, (A,)) if isinstance(x, d.StartShard)]
    assert [(s.node_id, s.spec.shard_id, s.spec.adapters) for s in starts] == [("n1", "r1-1", (A, B))]


def test_nothing_is_sent_when_the_lists_agree_or_the_replica_is_an_old_one() -> None:
    assert not [x for x in decided(SPEC, (A, B)) if isinstance(x, d.StartShard)]
    assert not [x for x in decided(SPEC, (A,), fingerprint="old") if isinstance(x, d.StartShard)]
