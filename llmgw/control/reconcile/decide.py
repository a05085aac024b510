"""The reconciler: desired state + observations + time -> decisions (pure).

Level-triggered: every call looks at everything and says what should happen
now, so a lost event, a restart or a repeated call costs nothing but another
look. Commands are idempotent on the agent's side (a shard id names one
process), so resending one that may have been lost is always safe.

A pass runs its parts in order over one working copy (``Pass``), one file per job:

* ``observe``: what each placed replica's shards say, rank by rank (a one-node
  replica is a group of one), moves its phase; ``terminating``: a replica being
  removed is drained, stopped, and deleted once its shards are gone;
* ``rollout``: replica counts, rolls to a new spec, nodes being drained, and
  hung replicas replaced (``liveness`` says what counts as evidence);
* ``place``: Pending replicas get nodes (``control.placement``);
* ``orphans``: live shards no replica wants are stopped;
* then ``weightsgc``: fetched weights nothing asks for leave full nodes.

``shardspec`` says what a StartShard carries; ``decisions`` what a pass decides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from llmgw.control import events as ev
from llmgw.control.placement import fit
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile import liveness, observe, orphans, place, rollout, weightsgc
from llmgw.control.reconcile.orphans import ORPHAN_REASON
from llmgw.control.reconcile.shardspec import DEFAULT_HUB_ENDPOINT, Hub
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec

#: Hub, its default endpoint, the orphans' reason and the placer are read from here by the server and the cluster.
__all__ = ["DEFAULT_HUB_ENDPOINT", "ORPHAN_REASON", "Config", "Hub", "Pass", "backoff", "fit", "reconcile"]


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    #: How long a node may be gone before its replicas are placed elsewhere.
    node_grace_s: float = 30.0
    #: How long to wait for a command's effect before sending it again.
    resend_s: float = 10.0
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    #: Failures in a row after which the message calls it a crash loop.
    crash_loop_after: int = 5
    #: How long a Ready replica being removed may take to finish its requests.
    drain_timeout_s: float = 30.0
    #: How long a shard its agent calls Unhealthy stays so before it is replaced (``liveness`` says why).
    unhealthy_grace_s: float = liveness.UNHEALTHY_GRACE_S
    #: The grace when a router has also ejected the replica: two witnesses on two paths agree,
    #: and the stall is failing real requests now.
    corroborated_grace_s: float = 5.0
    #: Fetched weights no model asks for are removed from a node whose weights directory has less
    #: than this share free (percent; 0: never), least recently used first (``weightsgc``).
    weights_gc_free_below_pct: float = 10.0
    #: Where remote weights come from (``Hub``).
    hub: Hub = Hub()
    #: ``--sleep-overcommit``: a GPU whose replicas all sleep is offered to another replica while every
    #: replica on it stays within its memory × this (``placement/overcommit``); 1: never.
    sleep_overcommit: float = 1.0


def backoff(failures: int, cfg: Config) -> float:
    """Seconds to wait before the next attempt after ``failures`` failures in a row."""
    if failures <= 0:
        return 0.0
    return min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (failures - 1))


class Pass:
    """One reconcile pass: what it was given, a working copy of the replicas, and the decisions so far.

    The parts (``observe``, ``rollout``, ``place``, ``orphans``) each receive it and
    write their decisions into it; ``result`` puts them in the order they are carried out.
    """

    def __init__(self, models: Mapping[str, ModelSpec], replicas: list[ReplicaRecord],
                 nodes: Mapping[str, NodeView], now: float, cfg: Config,
                 ejected: Mapping[str, str] | None = None,
                 remote: Mapping[str, fit.RemoteWeights] | None = None,
                 load: Mapping[str, float] | None = None) -> None:
        self.models, self.nodes, self.now, self.cfg = models, nodes, now, cfg
        #: Requests in flight at each replica, by replica id, as the routers last reported them (issue 17).
        self.load: Mapping[str, float] = load or {}
        #: What was read of remote sources' metadata (None: no reader; ``llmgw.control.remotemeta``).
        self.remote = remote
        #: Replicas some router has ejected now, with the routers' sentence (``liveness``).
        self.ejected: Mapping[str, str] = ejected or {}
        self.original = {r.id: r for r in replicas}
        self.work = [dataclasses.replace(r) for r in replicas]
        self.commands: list[d.Decision] = []
        self.deleted: set[str] = set()
        self.created: list[d.Decision] = []
        #: Terminating replicas by model (those of earlier passes and this one's), for the roll's surge bound.
        self.terminating: dict[str, list[ReplicaRecord]] = {}
        for r in self.work:
            if r.phase is Phase.TERMINATING:
                self.terminating.setdefault(r.model, []).append(r)

    @staticmethod
    def ranks(r: ReplicaRecord) -> tuple[Member, ...]:
        """A replica's ranks, the leader first: a one-node replica is a group of one (its node and shard)."""
        return r.members or (Member(0, r.node_id or "", r.shard_id or "", r.gpus),)

    @staticmethod
    def unplace(r: ReplicaRecord) -> None:
        """Back to Pending with no node: a group forgets its ranks too (their shards are stopped by then)."""
        r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
        r.members, r.leader_addr, r.leader_port = (), "", 0

    # -- failures and lifecycle ------------------------------------------------
    def fail(self, r: ReplicaRecord, reason: str, *, last_output: tuple[str, ...] = (),
             stop_shard: bool = False) -> None:
        if stop_shard and r.members:
            self.stop_members(r, reason)
        elif stop_shard and r.node_id and r.shard_id:
            self.commands.append(d.StopShard(r.node_id, r.shard_id, reason))
        r.failures += 1
        delay = backoff(r.failures, self.cfg)
        # A group's reason names the rank and its node itself.
        where = f" on node {r.node_id}" if r.node_id and not r.members else ""
        if r.failures >= self.cfg.crash_loop_after:
            r.message = (f"crash loop: failed {r.failures} times in a row{where}; last: {reason}; "
                         f"next try in {delay:.0f}s")
        else:
            r.message = f"{reason}{where}; next try in {delay:.0f}s (failure {r.failures} in a row)"
        self.unplace(r)
        r.next_attempt_at = self.now + delay
        if last_output:
            r.last_output = last_output

    def stop_members(self, r: ReplicaRecord, reason: str, *, but: str = "") -> None:
        """StopShard for every rank of a group (but ``but``, a shard known to be gone already)."""
        for m in r.members:
            if m.shard_id != but:
                self.commands.append(d.StopShard(m.node_id, m.shard_id, reason))

    def terminate(self, r: ReplicaRecord, reason: str) -> None:
        """Removes a replica; a Ready one is drained first, so no request in flight fails."""
        if r.phase is Phase.PENDING or not (r.node_id and r.shard_id):
            self.deleted.add(r.id)
            return
        was_ready = r.phase is Phase.READY
        self.terminating.setdefault(r.model, []).append(r)
        # Terminating replicas leave the router's table with this very write,
        # before the drain begins, so no new request reaches the engine.
        r.phase, r.message, r.sent_at = Phase.TERMINATING, reason, self.now
        if was_ready:
            # A group's leader is the one requests reach; its other ranks are
            # stopped once it has drained, since its requests need them to finish.
            self.commands.append(d.DrainShard(r.node_id, r.shard_id, int(self.cfg.drain_timeout_s)))
        elif r.members:
            self.stop_members(r, reason)
        else:
            self.commands.append(d.StopShard(r.node_id, r.shard_id, reason))

    def note(self, r: ReplicaRecord, kind: str, reason: str, message: str) -> None:
        self.commands.append(d.RecordEvent(ev.Event(self.now, kind, reason, f"replica/{r.id}", message,
                                                    model=r.model, node=r.node_id or "")))

    # -- hung engines (``liveness``), read by observe and rollout ------------------
    def grace(self, r: ReplicaRecord) -> float:
        return liveness.grace_s(self.cfg.unhealthy_grace_s, self.cfg.corroborated_grace_s,
                                ejected=r.id in self.ejected)

    def overdue(self, r: ReplicaRecord) -> bool:
        """An Unhealthy replica one of whose shards its agent has called Unhealthy for longer than the grace."""
        return self.overdue_shard(r) is not None

    def overdue_shard(self, r: ReplicaRecord) -> ShardStatus | None:
        """The status of the shard (a group's: of any rank) that makes ``r`` overdue, or None."""
        if r.phase is not Phase.UNHEALTHY:
            return None
        for m in self.ranks(r):
            node = self.nodes.get(m.node_id)
            st = node.shards.get(m.shard_id) if node is not None else None
            if node is not None and st is not None and st.state is ShardState.UNHEALTHY \
                    and self.now - node.unhealthy_since.get(st.shard_id, self.now) >= self.grace(r):
                return st
        return None

    def still_hung(self, r: ReplicaRecord) -> bool:
        """A replica being stopped whose engine still fails its probe (so it still holds its node's resources)."""
        for m in self.ranks(r):
            node = self.nodes.get(m.node_id)
            st = node.shards.get(m.shard_id) if node is not None else None
            if st is not None and liveness.probe_failing(st):
                return True
        return False

    def result(self) -> list[d.Decision]:
        out: list[d.Decision] = []
        for r in self.work:
            if r.id in self.deleted:
                out.append(d.DeleteReplica(r.id))
            elif r != self.original[r.id]:
                out.append(d.UpdateReplica(r))
        # Targets first, then commands: a command must never go out for a
        # target that was not written.
        return out + self.created + self.commands


def reconcile(models: Mapping[str, ModelSpec], replicas: list[ReplicaRecord],
              nodes: Mapping[str, NodeView], *, now: float, cfg: Config = Config(),
              ejected: Mapping[str, str] | None = None,
              remote: Mapping[str, fit.RemoteWeights] | None = None,
              removing: frozenset[tuple[str, str]] = frozenset(),
              load: Mapping[str, float] | None = None) -> list[d.Decision]:
    """Everything that should be done now to move the observed world toward the desired one.

    ``ejected``: the replicas some router has ejected now, each with the routers' sentence;
    evidence that shortens an Unhealthy replica's grace, never a reason on its own (``liveness``).
    ``remote``: remote sources' metadata read so far (``llmgw.control.remotemeta``); None when
    nothing reads it. ``removing``: (node, cache name) of RemoveWeights sent and not yet seen done.
    ``load``: requests in flight by replica id, as routers report them (``control.autoscaler``): a
    scale-down drains the least loaded Ready replica.
    """
    p = Pass(models, replicas, nodes, now, cfg, ejected, remote, load)
    for r in p.work:
        if r.phase in Phase.placed():
            observe.observe(p, r)
    rollout.scale(p)
    place.place_pending(p)
    orphans.stop_orphans(p)
    return p.result() + weightsgc.collect(models, nodes.values(), free_below_pct=cfg.weights_gc_free_below_pct,
                                          now=now, removing=removing)
