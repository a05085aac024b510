"""A node whose agent said goodbye gets nothing placed on it (issue 24: Ctrl-C on `make up` left an engine)."""

from __future__ import annotations

import dataclasses

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec

CFG = decide.Config(node_grace_s=30, resend_s=10, backoff_base_s=2, backoff_max_s=60, crash_loop_after=3)
SPEC = ModelSpec(engine="sim", served_name="m", startup_timeout_s=100)


def node(nid: str, *, leaving: str = "", stopped: str = "") -> NodeView:
    inv = Inventory(cpu_count=4, memory_total_bytes=8 << 30, memory_available_bytes=4 << 30, engines=(("sim", "1"),))
    shards = {stopped: ShardStatus(stopped, "r1", ShardState.STOPPED, message="agent stopping")} if stopped else {}
    return NodeView(nid, inv, connected=True, shards=shards, reported=True, leaving=leaving)


def test_a_shard_stopped_by_its_leaving_agent_is_not_started_again_there() -> None:
    """The replica whose shard its leaving agent stopped goes Pending, and no StartShard goes to that node: with
    no other node it waits, saying the node is leaving; with another node it starts there."""
    r = ReplicaRecord(id="r1", model="m", fingerprint=SPEC.fingerprint(), phase=Phase.READY, api_key="k",
                      node_id="n1", shard_id="r1-1", attempt=1)
    alone = decide.reconcile({"m": SPEC}, [r], {"n1": node("n1", leaving="agent stopping", stopped="r1-1")},
                             now=1000.0, cfg=CFG)
    assert [x for x in alone if isinstance(x, d.StartShard)] == []
    # The next pass, with the replica Pending: placement refuses the leaving node and says why.
    pending = dataclasses.replace(r, phase=Phase.PENDING, node_id=None, shard_id=None)
    again = decide.reconcile({"m": SPEC}, [pending], {"n1": node("n1", leaving="agent stopping")}, now=1001.0,
                             cfg=CFG)
    assert [x for x in again if isinstance(x, d.StartShard)] == []
    message = next(x.record.message for x in again if isinstance(x, d.UpdateReplica))
    assert "is leaving (agent stopping)" in message, message
    elsewhere = decide.reconcile({"m": SPEC}, [pending], {"n1": node("n1", leaving="agent stopping"),
                                                          "n2": node("n2")}, now=1001.0, cfg=CFG)
    assert [x.node_id for x in elsewhere if isinstance(x, d.StartShard)] == ["n2"]
