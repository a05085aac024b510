"""A replica being removed: drained (when it served), stopped, and deleted once every rank's shard is gone.

Removing a Ready replica drains it first, so no request in flight fails; a
group drains its leader (the rank requests reach), then stops every rank. A
rank whose node is lost past its grace is gone with it (if the node returns,
its shard is an orphan and is stopped); one whose node is away or has not
reported yet is waited for. Commands are resent every ``resend_s`` until the
shards say they took effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile.ranks import Rank, Seen
from llmgw.control.state import Member, NodeView, ReplicaRecord
from llmgw.core.shards import ShardState, ShardStatus

if TYPE_CHECKING:
    from llmgw.control.reconcile.decide import Pass


def observe(p: Pass, r: ReplicaRecord, ranks: list[Rank]) -> None:
    """Stops what still runs of a Terminating replica; deletes it once nothing does and nothing is unknown."""
    unknown = any(rank.seen in (Seen.AWAY, Seen.UNREPORTED) for rank in ranks)
    live = [(rank.member, rank.node, rank.st) for rank in ranks
            if rank.seen not in (Seen.LOST, Seen.AWAY, Seen.UNREPORTED)
            and rank.node is not None and rank.st is not None and rank.st.state not in ShardState.terminal()]
    if not live and not unknown:
        p.deleted.add(r.id)
    elif r.members:
        _stop_group(p, r, [(m, st) for m, _, st in live if st is not None])
    elif live and live[0][1] is not None and live[0][2] is not None:
        _stop_one(p, r, live[0][1], live[0][2])


def _stop_one(p: Pass, r: ReplicaRecord, node: NodeView, st: ShardStatus) -> None:
    shard = r.shard_id or ""
    reason = r.message or "stopping"
    if st.state in (ShardState.DRAINED, ShardState.STARTING, ShardState.FETCHING):
        # Idempotent on the agent, and Drained lasts only until it says Stopping;
        # a fetching shard has nothing to drain (its download goes on if another shard shares it).
        p.commands.append(d.StopShard(node.id, shard, reason))
    elif st.state is ShardState.DRAINING:
        if p.now - r.sent_at > p.cfg.drain_timeout_s + p.cfg.resend_s:
            p.commands.append(d.StopShard(node.id, shard, f"{reason} (drain did not finish)"))
    elif p.now - r.sent_at >= p.cfg.resend_s:
        r.sent_at = p.now
        if st.state is ShardState.READY:
            p.commands.append(d.DrainShard(node.id, shard, int(p.cfg.drain_timeout_s)))
        else:
            p.commands.append(d.StopShard(node.id, shard, reason))


def _stop_group(p: Pass, r: ReplicaRecord, live: list[tuple[Member, ShardStatus]]) -> None:
    """Drains the leader (when it was Ready), then stops every rank."""
    reason = r.message or "stopping"
    leader_busy = any(m.rank == 0 and st.state in (ShardState.READY, ShardState.DRAINING) for m, st in live)
    resend = p.now - r.sent_at >= p.cfg.resend_s
    for m, st in live:
        if m.rank == 0 and st.state is ShardState.READY:
            if resend:
                p.commands.append(d.DrainShard(m.node_id, m.shard_id, int(p.cfg.drain_timeout_s)))
        elif m.rank == 0 and st.state is ShardState.DRAINING:
            if p.now - r.sent_at > p.cfg.drain_timeout_s + p.cfg.resend_s:
                p.commands.append(d.StopShard(m.node_id, m.shard_id, f"{reason} (drain did not finish)"))
        elif leader_busy:
            continue  # the leader's requests in flight still need this rank
        elif st.state is not ShardState.STOPPING or resend:
            p.commands.append(d.StopShard(m.node_id, m.shard_id, reason))
    if resend:
        r.sent_at = p.now
