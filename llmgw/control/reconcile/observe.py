"""Observe: what a placed replica's shards say moves its phase, one path for every replica.

A replica is observed as a group of its ranks (``Pass.ranks``; a one-node
replica is a group of one): each rank's node and shard are read the same way
(``look``), in the same order of questions (``Seen``), and a rank whose
engine is lost, gone, stopped or failed ends the attempt (``_end``). What the
ranks say together then makes the replica Starting, Ready or Unhealthy, in
the words a one-node replica (``_one``) or a group (``_group``) has always used.

Two rules keep a restart from costing engine reloads:
* a replica on a node that is not connected is left alone for the node's grace
  period (a node never seen since this control plane started counts as
  disconnected since the start), so agents have time to reconnect and report
  what they run;
* only a node that has registered with this instance can have a shard judged
  missing.

A replica that spans nodes (``resources.nnodes`` > 1) is one shard per rank,
and the ranks live and die together: a real engine's ranks hang in their next
collective when one of them is gone, so a group cannot lose a rank and carry
on. It is Ready only when every rank is; a rank that fails, is stopped, or
whose node is lost past its grace stops every rank, and the whole group is
placed again (a failure with backoff). Its leader (rank 0) is what the router
sees: the replica's node, shard and endpoint are the leader's.

A Ready replica whose engine's health probe fails is Unhealthy: out of routing
at once, Ready again if a probe passes, and replaced (``rollout``) once its
agent has called the shard Unhealthy for longer than the grace.
A replica being removed is ``terminating``'s.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from llmgw.control import events as ev
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile import liveness, terminating
from llmgw.control.reconcile.ranks import ENDS, Rank, Seen, fetching_message, look
from llmgw.control.reconcile.shardspec import member_spec, shard_spec
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.core.shards import ShardState, ShardStatus

if TYPE_CHECKING:
    from llmgw.control.reconcile.decide import Pass


def observe(p: Pass, r: ReplicaRecord) -> None:
    """Moves a placed replica's phase by what its ranks say (a Terminating one: ``terminating``)."""
    ranks = [look(p, r, m) for m in p.ranks(r)]
    if r.phase is Phase.TERMINATING:
        terminating.observe(p, r, ranks)
        return
    ended = next((rank for rank in ranks if rank.seen in ENDS), None)
    if ended is not None:
        _end(p, r, ended)
    elif r.members:
        _group(p, r, ranks)
    else:
        _one(p, r, ranks[0])


# -- a rank that ends the attempt -------------------------------------------------
def _end(p: Pass, r: ReplicaRecord, rank: Rank) -> None:
    """A rank lost, gone, stopped (none of them the replica's failure) or failed (with backoff)."""
    m, st, group = rank.member, rank.st, bool(r.members)
    if rank.seen is Seen.FAILED:
        assert st is not None
        code = f" with code {st.exit_code}" if st.exit_code is not None else ""
        what = st.message or f"engine exited{code}"
        p.stop_members(r, f"rank {m.rank} of its group failed", but=m.shard_id)
        p.fail(r, f"rank {m.rank} on node {m.node_id} failed: {what}" if group else what, last_output=st.last_output)
        return
    if rank.seen is Seen.LOST:
        where = rank.node.id if rank.node else "?"
        why, message = f"rank {m.rank} of its group is gone", (
            f"node {m.node_id} (rank {m.rank}) lost for {rank.gone_for:.0f}s; a group cannot lose a rank, so every "
            "rank is stopped and the group is placed again" if group
            else f"node {where} lost for {rank.gone_for:.0f}s; placing elsewhere")
    elif rank.seen is Seen.GONE:
        # The node registered with its full list and this shard is not on it: the engine is gone
        # (the agent was restarted and could not keep it).
        why, message = f"rank {m.rank} of its group is gone", (
            f"the engine of rank {m.rank} is gone from node {m.node_id}; starting the group again" if group
            else f"its engine is gone from node {m.node_id}; starting a new one")
    else:
        # Stopped on its node without being asked by us (its agent was shut down, say).
        said = f" ({st.message})" if st is not None and st.message else ""
        why, message = f"rank {m.rank} of its group was stopped", (
            f"the engine of rank {m.rank} was stopped on node {m.node_id}{said}; starting the group again" if group
            else f"its engine was stopped on node {m.node_id}{said}; starting a new one")
    _restart(p, r, rank, why, message)


def _restart(p: Pass, r: ReplicaRecord, rank: Rank, why: str, message: str) -> None:
    """Stops every other rank and places the replica again; not its failure, so no backoff counted.

    A group's new attempt waits ``backoff_base_s`` all the same: the surviving
    ranks hold their GPUs until their engines have exited, and a new rank started
    at once on one of those nodes would be given the GPUs an old rank still has
    memory on. A one-node replica has no surviving rank, and is placed at once.
    """
    wait = p.cfg.backoff_base_s if r.members else 0.0
    p.stop_members(r, why, but=rank.member.shard_id)
    p.unplace(r)
    r.next_attempt_at = p.now + wait
    r.message = message


# -- a one-node replica -------------------------------------------------------------
def _one(p: Pass, r: ReplicaRecord, rank: Rank) -> None:
    node, st = rank.node, rank.st
    if rank.seen is Seen.AWAY:
        r.message = (f"node {r.node_id} is not connected; waiting up to "
                     f"{p.cfg.node_grace_s:.0f}s for it before placing elsewhere")
        return
    # An adopted engine has served all along, so it stays Ready (and routed) while its restarted
    # agent checks it (a check that fails is reported Failed). A Stopping we did not ask for: wait for it to end.
    if node is None or rank.seen in (Seen.UNREPORTED, Seen.ADOPTED, Seen.OTHER):
        return
    if rank.seen is Seen.STARTING:
        _starting(p, r, node, st)
        return
    assert st is not None
    if rank.seen is Seen.FETCHING:
        # The startup timeout is for loading, and starts when the agent says
        # Starting: a 400 GB download is not a hung engine, and replacing it
        # would only start the same download on another node. A fetch that
        # fails is reported Failed by the agent, with the fetcher's sentence.
        r.started_at = p.now
        r.message = fetching_message(node.id, st)
    elif rank.seen is Seen.PROBE_FAILING:
        _unhealthy(p, r, node, st)
    elif r.phase is not Phase.READY:
        r.phase, r.ready_at, r.failures = Phase.READY, p.now, 0
        r.endpoint, r.message, r.last_output = st.endpoint, f"serving on node {node.id}", ()
    elif _adapters_changed(p, r, st):
        # spec.adapters changed and nothing the engine was started with: the same shard, told the new
        # list, loads and unloads at runtime (``agent.supervisor.loras``). Idempotent, so a resend is harmless.
        r.sent_at = p.now
        p.commands.append(d.StartShard(node.id, shard_spec(r, p.models[r.model], hub=p.cfg.hub)))
    elif r.id in p.ejected:
        # A router's word alone moves nothing (``liveness``): said, and kept in rotation.
        p.note(r, ev.NORMAL, "EjectedByRouter",
               f"{p.ejected[r.id]}; its agent's health probe passes on node {node.id}, so it "
               "stays in the other routers' rotation and is not replaced")


def _adapters_changed(p: Pass, r: ReplicaRecord, st: ShardStatus) -> bool:
    """Whether a ready one-node shard of the model's current engine holds another adapter list than its spec's."""
    spec = p.models.get(r.model)
    if spec is None or st.spec is None or r.fingerprint != spec.fingerprint() or p.now - r.sent_at < 1.0:
        return False
    return [(a.name, a.source) for a in st.spec.adapters] != [(a.name, a.source) for a in spec.adapters]


def _starting(p: Pass, r: ReplicaRecord, node: NodeView, st: ShardStatus | None) -> None:
    spec = p.models.get(r.model)
    if st is None and spec is not None and r.sent_at < node.registered_at:
        # Sent on a stream that has since gone, so it may never have
        # arrived: send it again now, and the startup clock starts
        # again with it. Without the reset, a replica placed just
        # before a restart was failed for a timeout at once (seen on a
        # second `make up`: "did not become ready within 300s").
        r.sent_at = r.started_at = p.now
        p.commands.append(d.StartShard(node.id, shard_spec(r, spec, hub=p.cfg.hub)))
        return
    if spec is not None and p.now - r.started_at > spec.startup_timeout_s:
        p.fail(r, f"did not become ready within {spec.startup_timeout_s:.0f}s", stop_shard=True)
    elif st is None and spec is not None and p.now - r.sent_at >= p.cfg.resend_s:
        r.sent_at = p.now
        p.commands.append(d.StartShard(node.id, shard_spec(r, spec, hub=p.cfg.hub)))
    elif st is not None:
        r.message, r.endpoint = f"starting on node {node.id}", st.endpoint


def _unhealthy(p: Pass, r: ReplicaRecord, node: NodeView, st: ShardStatus) -> None:
    """Its engine's probe fails: out of routing now; the agent's Unhealthy starts the grace."""
    if r.phase is not Phase.UNHEALTHY:
        # From Starting too: a shard that went Ready and then failed between two passes.
        r.phase, r.endpoint = Phase.UNHEALTHY, st.endpoint or r.endpoint
    why = liveness.reason(st)
    if st.state is not ShardState.UNHEALTHY:
        r.message = f"health probe failing on node {node.id}: {why}; not routed until a probe passes"
        return
    if st.last_output:
        r.last_output = st.last_output
    grace = p.grace(r)
    if not p.overdue(r):
        seconded = f"; {p.ejected[r.id]}" if r.id in p.ejected else ""
        r.message = (f"unhealthy on node {node.id}: {why}{seconded}; replaced unless it recovers within "
                     f"{grace:.0f}s")
        return
    r.message = f"unhealthy on node {node.id} past its {grace:.0f}s grace: {why}"


# -- a group ------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class _Tally:
    """What a group's ranks said, none of them ending the attempt."""

    ready: list[ShardStatus] = dataclasses.field(default_factory=list)
    hung: list[tuple[Member, ShardStatus]] = dataclasses.field(default_factory=list)
    waiting: list[str] = dataclasses.field(default_factory=list)
    resend: list[Member] = dataclasses.field(default_factory=list)
    fetching: bool = False


def _tally(p: Pass, r: ReplicaRecord, ranks: list[Rank]) -> _Tally:
    t = _Tally()
    for rank in ranks:
        m, node, st = rank.member, rank.node, rank.st
        if rank.seen is Seen.AWAY or node is None:
            t.waiting.append(f"node {m.node_id} (rank {m.rank}) is not connected; waiting up to "
                             f"{p.cfg.node_grace_s:.0f}s for it before placing the group again")
        elif rank.seen is Seen.UNREPORTED:
            t.waiting.append(f"waiting for node {m.node_id} (rank {m.rank}) to report")
        elif rank.seen is Seen.STARTING:
            if st is None and (r.sent_at < node.registered_at or p.now - r.sent_at >= p.cfg.resend_s):
                t.resend.append(m)
            t.waiting.append(f"rank {m.rank} starting on node {m.node_id}")
        elif st is None:
            continue  # not reached: a rank with no shard is Starting, or Gone (which ends the attempt)
        elif rank.seen is Seen.FETCHING:
            t.fetching = True  # the group's startup timeout waits for its slowest rank's fetch
            t.waiting.append(fetching_message(m.node_id, st, rank=m.rank))
        elif rank.seen in (Seen.ADOPTED, Seen.READY, Seen.PROBE_FAILING):
            # Adopted: a restarted agent is checking an engine that served all along. Probe
            # failing: a rank that stopped answering stalls the whole group (the others wait
            # in a collective), so the group is Unhealthy once every rank is up.
            t.ready.append(st)
            if rank.seen is Seen.PROBE_FAILING:
                t.hung.append((m, st))
        else:
            t.waiting.append(f"rank {m.rank} is {st.state.value} on node {m.node_id}")
    return t


def _group(p: Pass, r: ReplicaRecord, ranks: list[Rank]) -> None:
    """A Starting or Ready group: Ready once every rank is; Unhealthy when one fails its probe."""
    t = _tally(p, r, ranks)
    leader = r.members[0]
    serving = (f"serving on node {leader.node_id} (leader of {len(r.members)} ranks on "
               f"{', '.join(m.node_id for m in r.members)})")
    if t.hung and len(t.ready) == len(r.members):
        m, st = t.hung[0]
        r.phase = Phase.UNHEALTHY
        if st.state is ShardState.UNHEALTHY:
            r.last_output = st.last_output or r.last_output
            r.message = (f"unhealthy: rank {m.rank} on node {m.node_id}: {liveness.reason(st)}; the group is "
                         f"replaced unless it recovers within {p.grace(r):.0f}s")
        else:
            r.message = (f"health probe failing on rank {m.rank} on node {m.node_id}: {liveness.reason(st)}; "
                         "not routed until a probe passes")
        return
    if len(t.ready) == len(r.members):
        if r.phase is not Phase.READY:
            endpoint = next((st.endpoint for st in t.ready if st.shard_id == leader.shard_id), "")
            r.phase, r.ready_at, r.failures = Phase.READY, p.now, 0
            r.endpoint, r.last_output = endpoint, ()
        r.message = serving
        return
    if r.phase is Phase.READY or r.phase is Phase.UNHEALTHY:
        # A rank's node is within its grace, or a rank is being checked by a
        # restarted agent: the group stays routed meanwhile, as one node would.
        r.message = t.waiting[0] if t.waiting else serving
        return
    _group_starting(p, r, t)


def _group_starting(p: Pass, r: ReplicaRecord, t: _Tally) -> None:
    spec = p.models.get(r.model)
    if t.fetching:
        r.started_at = p.now
    elif spec is not None and p.now - r.started_at > spec.startup_timeout_s:
        p.fail(r, f"did not become ready within {spec.startup_timeout_s:.0f}s "
                  f"({len(t.ready)} of {len(r.members)} ranks ready)", stop_shard=True)
        return
    if t.resend and spec is not None:
        if any(r.sent_at < p.nodes[m.node_id].registered_at for m in t.resend):
            r.started_at = p.now  # sent on a stream that has gone: the startup clock starts again
        r.sent_at = p.now
        for m in t.resend:
            p.commands.append(d.StartShard(m.node_id, member_spec(r, spec, m, hub=p.cfg.hub)))
    r.message = f"{len(t.ready)} of {len(r.members)} ranks ready; {t.waiting[0]}" if t.waiting else r.message
