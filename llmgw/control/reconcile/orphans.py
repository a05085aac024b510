"""Orphans: live shards no replica wants are stopped.

A shard is an orphan when the attempt that started it was replaced, when its
replica was deleted while its node was gone, or when a node that was given up
on comes back still running it. Only a connected node that has reported its
whole shard list can have one, and a shard already asked to stop (or stopping)
is not asked again in the same pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.control.reconcile import decisions as d
from llmgw.core.shards import ShardState

if TYPE_CHECKING:
    from llmgw.control.reconcile.decide import Pass

#: The reason a StopShard for a shard no replica wants gives (the events log tells these apart).
ORPHAN_REASON = "no replica wants this shard"


def stop_orphans(p: Pass) -> None:
    """Stops live shards no replica wants: left by a replaced attempt, or on a node that came back."""
    wanted: set[tuple[str | None, str | None]] = {(r.node_id, r.shard_id) for r in p.work
                                                   if r.id not in p.deleted and r.shard_id}
    # Every rank of a live group is wanted, not only its leader.
    wanted |= {(m.node_id, m.shard_id) for r in p.work if r.id not in p.deleted for m in r.members}
    # Asked for before this loop: the union is made once (made per shard, it cost seconds at 10,000 replicas).
    wanted |= {(c.node_id, c.shard_id) for c in p.commands if isinstance(c, d.StopShard)}
    live = ShardState.live() - {ShardState.STOPPING}
    for node in p.nodes.values():
        if not (node.connected and node.reported):
            continue
        for shard_id, st in node.shards.items():
            if st.state in live and (node.id, shard_id) not in wanted:
                p.commands.append(d.StopShard(node.id, shard_id, ORPHAN_REASON))
