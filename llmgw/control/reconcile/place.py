"""Place: Pending replicas get a node (a group: one node per rank) and a StartShard for each shard.

Higher-priority models are placed first, then older replicas. One ledger and
one placer (``control.placement.fit``) serve the whole pass, so what one replica
takes (threads, memory, GPU indices, a leader's rendezvous port) is not handed
to the next. A replica that fits nowhere stays Pending with the placer's
sentence as its message; one in its backoff waits for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.control import events as ev
from llmgw.control.placement import fit, overcommit
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile.shardspec import member_spec, shard_spec
from llmgw.control.state import Member, Phase, ReplicaRecord
from llmgw.core.specs import ModelSpec
from llmgw.core.units import format_bytes

if TYPE_CHECKING:
    from llmgw.control.reconcile.decide import Pass


def place_pending(p: Pass) -> None:
    """Places pending replicas, higher-priority models first, then oldest first."""
    active = [r for r in p.work if r.id not in p.deleted]
    if not any(r.phase is Phase.PENDING and r.model in p.models and r.next_attempt_at <= p.now for r in active):
        # Building the placer indexes every node: three quarters of a pass over 10,000
        # nodes with nothing to place, holding the event loop heartbeats wait on.
        return
    ledger = fit.Ledger(active, p.models)
    overcommit.lend(ledger, active, p.nodes, overcommit=p.cfg.sleep_overcommit)
    placer = fit.Placer(p.nodes.values(), ledger, remote=p.remote)
    # Rendezvous ports held by the groups already placed: a second leader on
    # the same node given the same port would meet the first group's ranks.
    position = {st.view.id: st.idx for st in placer.states}
    for r in active:
        if r.members and r.phase in Phase.placed() and r.members[0].node_id in position:
            placer.leader_ports.setdefault(position[r.members[0].node_id], set()).add(r.leader_port)

    def order(r: ReplicaRecord) -> tuple[int, float, str]:
        spec = p.models.get(r.model)
        return (-(spec.priority if spec is not None else 0), r.created_at, r.id)

    for r in sorted(active, key=order):
        if r.phase is not Phase.PENDING or r.model not in p.models:
            continue
        if r.next_attempt_at > p.now:
            continue
        spec = p.models[r.model]
        if spec.resources.nnodes > 1:
            place_group(p, placer, r, spec)
        else:
            place_one(p, placer, r, spec)


def place_one(p: Pass, placer: fit.Placer, r: ReplicaRecord, spec: ModelSpec) -> None:
    """Places a one-node replica: a node, its GPUs, and one StartShard."""
    result = placer.place(r.model, spec, replica_id=r.id)
    if isinstance(result, fit.Refused):
        r.message, r.gpus = result.message, ()
        return
    r.phase, r.node_id, r.gpus = Phase.STARTING, result.node_id, result.gpus
    r.memory_bytes, r.memory_estimated = result.memory_bytes, result.memory_estimated
    r.attempt += 1
    r.shard_id = f"{r.id}-{r.attempt}"
    r.started_at = r.sent_at = p.now
    where = f" (GPU {', '.join(map(str, result.gpus))})" if result.gpus else ""
    estimated = (f"; memory estimated from weights: {format_bytes(result.memory_bytes)}"
                 f"{' per GPU' if result.gpus else ''}" if result.memory_estimated else "")
    # A remote source whose metadata could not be read: placed all the same (the hub being
    # offline must not hold a model that states its memory, or one that fits anyway), and
    # the replica says why its memory was not estimated.
    unknown = f"; memory not estimated: {result.metadata_problem}" if result.metadata_problem else ""
    r.endpoint, r.message = "", f"starting on node {result.node_id}{where}{estimated}{unknown}"
    if unknown:
        p.note(r, ev.WARNING, "WeightsMetadataUnknown", result.metadata_problem)
    p.commands.append(d.StartShard(result.node_id, shard_spec(r, spec, hub=p.cfg.hub)))


def place_group(p: Pass, placer: fit.Placer, r: ReplicaRecord, spec: ModelSpec) -> None:
    """Places a replica that spans nodes: one StartShard per rank, each told where the leader is."""
    group = fit.place_group(placer, r.model, spec, replica_id=r.id)
    if isinstance(group, fit.Refused):
        r.message, r.gpus = group.message, ()
        return
    r.attempt += 1
    r.members = tuple(Member(k.rank, k.node_id, f"{r.id}-{r.attempt}-{k.rank}", k.gpus, k.hcas)
                      for k in group.ranks)
    leader = r.members[0]
    r.phase, r.node_id, r.shard_id, r.gpus = Phase.STARTING, leader.node_id, leader.shard_id, leader.gpus
    r.leader_addr, r.leader_port = group.leader_addr, group.leader_port
    r.memory_bytes, r.memory_estimated = group.memory_bytes, group.memory_estimated
    r.started_at = r.sent_at = p.now
    r.endpoint = ""
    r.message = (f"starting {len(r.members)} ranks on fabric {group.fabric} "
                 f"({', '.join(m.node_id for m in r.members)}); leader {leader.node_id} at "
                 f"{group.leader_addr}:{group.leader_port}")
    for m in r.members:
        p.commands.append(d.StartShard(m.node_id, member_spec(r, spec, m, hub=p.cfg.hub)))
