"""How the reconciler reads one rank of a placed replica: its node, its shard there, and what they say.

Every replica is read rank by rank (a one-node replica is a group of one:
``Pass.ranks``), by ``look``, in one order of questions (``Seen``); ``observe``
and ``terminating`` act on the answers.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

from llmgw.control.reconcile import liveness
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.core.shards import ShardState, ShardStatus

if TYPE_CHECKING:
    from llmgw.control.reconcile.decide import Pass


class Seen(enum.Enum):
    """What one rank's node and shard say, asked in this order (the first that holds)."""

    LOST = "its node is gone past the grace (or unknown)"
    AWAY = "its node is not connected, within the grace"
    UNREPORTED = "its node has not registered its whole shard list with this control plane"
    ADOPTED = "a restarted agent is checking an engine that served all along"
    GONE = "it served, and its node's whole list lacks the shard"
    FETCHING = "fetching its weights"
    STARTING = "starting, or not heard of yet"
    PROBE_FAILING = "its engine's health probe fails"
    READY = "ready"
    STOPPED = "stopped on its node, unasked"
    FAILED = "failed"
    OTHER = "stopping unasked, or another state to wait out"


#: What a rank can say that ends the replica's attempt (a tuple: an enum's hash is a Python call).
ENDS = (Seen.LOST, Seen.GONE, Seen.STOPPED, Seen.FAILED)


class Rank(NamedTuple):
    """One rank as this pass sees it: its node, its shard's last status there, and what they say."""

    member: Member
    node: NodeView | None
    st: ShardStatus | None
    #: How long its node has been gone (0: connected, or it said its shard ended before it left).
    gone_for: float
    seen: Seen


def look(p: Pass, r: ReplicaRecord, m: Member) -> Rank:
    """Reads rank ``m`` of ``r`` from its node's last report."""
    node = p.nodes.get(m.node_id)
    st = node.shards.get(m.shard_id) if node is not None else None
    # What a node said last still counts after it went away: an agent that
    # stopped its engines and then disconnected said so, and waiting out
    # its grace period would keep routing to engines known to be gone.
    said_gone = st is not None and st.state in ShardState.terminal()
    away = node is None or (not node.connected and not said_gone)
    gone_for = (p.now - node.disconnected_since if node is not None else float("inf")) if away else 0.0
    return Rank(m, node, st, gone_for, _seen(p, r, node, st, away=away, gone_for=gone_for))


def _seen(p: Pass, r: ReplicaRecord, node: NodeView | None, st: ShardStatus | None, *, away: bool,
          gone_for: float) -> Seen:
    if away and gone_for > p.cfg.node_grace_s:
        return Seen.LOST
    # A group's rank whose node left this very instant (gone 0s) is judged on what it said last.
    if away and (not r.members or gone_for):
        return Seen.AWAY
    assert node is not None
    if not node.reported:
        return Seen.UNREPORTED
    serving = r.phase is Phase.READY or r.phase is Phase.UNHEALTHY
    if st is not None and st.adopted and st.state is ShardState.STARTING and serving:
        return Seen.ADOPTED
    if st is None:
        return Seen.GONE if serving else Seen.STARTING
    if st.state is ShardState.FETCHING:
        return Seen.FETCHING
    if st.state is ShardState.STARTING:
        return Seen.STARTING
    if liveness.probe_failing(st):
        return Seen.PROBE_FAILING
    return {ShardState.READY: Seen.READY, ShardState.STOPPED: Seen.STOPPED,
            ShardState.FAILED: Seen.FAILED}.get(st.state, Seen.OTHER)


def fetching_message(node_id: str, st: ShardStatus, *, rank: int | None = None) -> str:
    """What a replica whose shard fetches its weights says: no percentage, which would be written every pass."""
    who = f"rank {rank} " if rank is not None else ""
    stalled = st.fetch is not None and st.fetch.state == "stalled"
    said = f": {st.fetch.message}" if stalled and st.fetch is not None and st.fetch.message else ""
    return f"{who}fetching its weights on node {node_id}{' (stalled' + said + ')' if stalled else ''}"
