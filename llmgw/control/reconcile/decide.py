"""The reconciler: desired state + observations + time -> decisions (pure).

Level-triggered: every call looks at everything and says what should happen
now, so a lost event, a restart or a repeated call costs nothing but another
look. Commands are idempotent on the agent's side (a shard id names one
process), so resending one that may have been lost is always safe.

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
sees: the replica's node, shard and endpoint are the leader's. Removing a
Ready group drains the leader, then stops every rank.

A Ready replica whose engine's health probe fails is Unhealthy: out of routing
at once, Ready again if a probe passes, and replaced like a failed one once its
agent has called the shard Unhealthy for longer than the grace
(``liveness`` says what counts as evidence). Unlike a failed one, it is
replaced as a roll replaces an outdated replica: the replacement is created
within ``max_surge`` and the hung one is stopped (StopShard, never Drain: a
hung engine never finishes its requests, and the agent SIGKILLs it after its
stop grace, since a stopped process ignores SIGTERM) once the replacement is
Ready. Until then it keeps its node's resources, so the replacement is not
placed onto the GPU that may be what wedged it. With ``max_surge`` 0 there is
no room for a replacement beside it, and waiting would wait for ever: it is
stopped at once and replaced in its place; likewise when the replacement was
refused a node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from llmgw.control import events as ev
from llmgw.control.placement import fit
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile import liveness, weightsgc
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.core import specs
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.core.specs import ModelSpec
from llmgw.core.units import format_bytes

#: The reason a StopShard for a shard no replica wants gives (the events log tells these apart).
ORPHAN_REASON = "no replica wants this shard"


#: Where hf:// sources come from when the control plane is told nothing else.
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


@dataclasses.dataclass(frozen=True, slots=True)
class Hub:
    """Where a node fetches remote weights from, as the control plane's settings say."""

    #: The HF-compatible endpoint of hf:// sources: the hub itself, or the cluster's mirror.
    endpoint: str = DEFAULT_HUB_ENDPOINT
    #: The cluster mirror's base URL, for mirror:// sources ("": none).
    mirror_url: str = ""
    #: The hub's bearer token; a secret: kept out of reprs, sent only in an hf:// shard's StartShard.
    token: str = dataclasses.field(default="", repr=False)


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
    #: How long a shard its agent calls Unhealthy stays so before it is replaced (it is out of
    #: routing from its first failed probe all the same). The agent already waited out its probe
    #: threshold; this grace is for the stall that passes (an engine swapping under a memory
    #: spike, a long GC pause), which costs nothing to wait out, when a replacement costs a
    #: weight load (minutes for a big model) and a wedged one costs only its share of capacity.
    unhealthy_grace_s: float = 30.0
    #: The grace when a router has also ejected the replica: two witnesses on two paths agree,
    #: and the stall is failing real requests now.
    corroborated_grace_s: float = 5.0
    #: Fetched weights no model asks for are removed from a node whose weights directory has less
    #: than this share free (percent; 0: never), least recently used first (``weightsgc``).
    weights_gc_free_below_pct: float = 10.0
    #: Where remote weights come from (``Hub``).
    hub: Hub = Hub()


def backoff(failures: int, cfg: Config) -> float:
    """Seconds to wait before the next attempt after ``failures`` failures in a row."""
    if failures <= 0:
        return 0.0
    return min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (failures - 1))


def remote_fields(source: str, spec: ModelSpec, hub: Hub) -> dict[str, str]:
    """The ShardSpec fields a node needs to fetch ``source``: none for a local one (a file, a package).

    The token goes to an hf:// shard alone: an http(s) or mirror source, or a
    local one, has no use for it, and every copy is one more place it can leak from.
    """
    if source.startswith("hf://"):
        return {"hub_endpoint": hub.endpoint, "hub_token": hub.token, "source_file": spec.source_file}
    if source.startswith("mirror://"):
        return {"mirror_url": hub.mirror_url, "source_sha256": spec.source_sha256}
    if source.startswith(("http://", "https://")):
        return {"source_sha256": spec.source_sha256}
    return {}


def fetching_message(node_id: str, st: ShardStatus, *, rank: int | None = None) -> str:
    """What a replica whose shard fetches its weights says: no percentage, which would be written every pass."""
    who = f"rank {rank} " if rank is not None else ""
    stalled = st.fetch is not None and st.fetch.state == "stalled"
    said = f": {st.fetch.message}" if stalled and st.fetch is not None and st.fetch.message else ""
    return f"{who}fetching its weights on node {node_id}{' (stalled' + said + ')' if stalled else ''}"


def shard_spec(r: ReplicaRecord, spec: ModelSpec, *, hub: Hub = Hub()) -> ShardSpec:
    assert r.shard_id is not None
    tp, pp = specs.parallelism(spec.resources)
    return ShardSpec(
        shard_id=r.shard_id, replica_id=r.id, model=r.model, engine=spec.engine,
        served_name=spec.served_name, source=spec.source, args=spec.engine_args, api_key=r.api_key,
        threads=spec.resources.cpu_threads, memory_bytes=spec.resources.memory_bytes,
        startup_timeout_s=int(spec.startup_timeout_s), env=spec.env, gpus=r.gpus,
        tensor_parallel=tp, pipeline_parallel=pp, dtype=spec.dtype, context_length=spec.context_length,
        gpu_memory_bytes=r.memory_bytes if spec.resources.gpus.count else 0, engine_version=spec.engine_version,
        **remote_fields(spec.source, spec, hub),
    )


def member_spec(r: ReplicaRecord, spec: ModelSpec, m: Member, *, hub: Hub = Hub()) -> ShardSpec:
    """The shard of one rank of a group: its GPUs and adapters, and the leader every rank meets at."""
    return dataclasses.replace(shard_spec(r, spec, hub=hub), shard_id=m.shard_id, gpus=m.gpus, nnodes=len(r.members),
                               rank=m.rank, leader_addr=r.leader_addr, leader_port=r.leader_port, hcas=m.hcas)


def _unplace(r: ReplicaRecord) -> None:
    """Back to Pending with no node: a group forgets its ranks too (their shards are stopped by then)."""
    r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
    r.members, r.leader_addr, r.leader_port = (), "", 0


class _Pass:
    """One reconcile pass: a working copy of the replicas and the decisions so far."""

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
        _unplace(r)
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

    # -- observation -------------------------------------------------------------
    def observe(self, r: ReplicaRecord) -> None:
        if r.members:
            if r.phase is Phase.TERMINATING:
                self.observe_group_terminating(r)
            else:
                self.observe_group(r)
            return
        node = self.nodes.get(r.node_id or "")
        last = node.shards.get(r.shard_id or "") if node is not None else None
        # What a node said last still counts after it went away: an agent that
        # stopped its engines and then disconnected said so, and waiting out
        # its grace period would keep routing to engines known to be gone.
        said_gone = last is not None and last.state in ShardState.terminal()
        if node is None or (not node.connected and not said_gone):
            gone_for = self.now - node.disconnected_since if node else float("inf")
            if r.phase is Phase.TERMINATING:
                if gone_for > self.cfg.node_grace_s:
                    self.deleted.add(r.id)  # if the node returns, its shard is an orphan and is stopped
            elif gone_for > self.cfg.node_grace_s:
                r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
                r.next_attempt_at = self.now
                r.message = f"node {node.id if node else '?'} lost for {gone_for:.0f}s; placing elsewhere"
            else:
                r.message = (f"node {r.node_id} is not connected; waiting up to "
                             f"{self.cfg.node_grace_s:.0f}s for it before placing elsewhere")
            return
        if not node.reported:
            return
        st = last
        if r.phase is Phase.TERMINATING:
            self.observe_terminating(r, node, st)
            return
        spec = self.models.get(r.model)
        serving = r.phase is Phase.READY or r.phase is Phase.UNHEALTHY
        if st is not None and st.adopted and st.state is ShardState.STARTING and serving:
            # A restarted agent found this engine running and is checking it;
            # it has served all along, so it stays Ready (and routed) meanwhile.
            # If the check fails the agent reports it Failed, and it is replaced.
            return
        if st is None and serving:
            # The node registered with its full list and this shard is not on
            # it: the engine is gone (the agent was restarted and could not
            # keep it). Not the replica's failure, so no backoff.
            r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
            r.next_attempt_at = self.now
            r.message = f"its engine is gone from node {node.id}; starting a new one"
            return
        if st is not None and st.state is ShardState.FETCHING:
            # The startup timeout is for loading, and starts when the agent says
            # Starting: a 400 GB download is not a hung engine, and replacing it
            # would only start the same download on another node. A fetch that
            # fails is reported Failed by the agent, with the fetcher's sentence.
            r.started_at = self.now
            r.message = fetching_message(node.id, st)
            return
        if st is None or st.state is ShardState.STARTING:
            if st is None and spec is not None and r.sent_at < node.registered_at:
                # Sent on a stream that has since gone, so it may never have
                # arrived: send it again now, and the startup clock starts
                # again with it. Without the reset, a replica placed just
                # before a restart was failed for a timeout at once (seen on a
                # second `make up`: "did not become ready within 300s").
                r.sent_at = r.started_at = self.now
                self.commands.append(d.StartShard(node.id, shard_spec(r, spec, hub=self.cfg.hub)))
                return
            if spec is not None and self.now - r.started_at > spec.startup_timeout_s:
                self.fail(r, f"did not become ready within {spec.startup_timeout_s:.0f}s", stop_shard=True)
            elif st is None and spec is not None and self.now - r.sent_at >= self.cfg.resend_s:
                r.sent_at = self.now
                self.commands.append(d.StartShard(node.id, shard_spec(r, spec, hub=self.cfg.hub)))
            elif st is not None:
                r.message, r.endpoint = f"starting on node {node.id}", st.endpoint
            return
        if liveness.probe_failing(st):
            self.unhealthy(r, node, st)
            return
        if st.state is ShardState.READY:
            if r.phase is not Phase.READY:
                r.phase, r.ready_at, r.failures = Phase.READY, self.now, 0
                r.endpoint, r.message, r.last_output = st.endpoint, f"serving on node {node.id}", ()
            elif r.id in self.ejected:
                # A router's word alone moves nothing (``liveness``): said, and kept in rotation.
                self.note(r, ev.NORMAL, "EjectedByRouter",
                          f"{self.ejected[r.id]}; its agent's health probe passes on node {node.id}, so it "
                          "stays in the other routers' rotation and is not replaced")
            return
        if st.state is ShardState.STOPPED:
            # Stopped on its node without being asked by us (its agent was
            # shut down, say): not the engine's failure, so no backoff.
            why = f" ({st.message})" if st.message else ""
            r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
            r.next_attempt_at = self.now
            r.message = f"its engine was stopped on node {node.id}{why}; starting a new one"
            return
        if st.state is ShardState.FAILED:
            code = f" with code {st.exit_code}" if st.exit_code is not None else ""
            what = st.message or f"engine exited{code}"
            self.fail(r, what, last_output=st.last_output)
        # STOPPING that we did not ask for: wait for it to end.

    def note(self, r: ReplicaRecord, kind: str, reason: str, message: str) -> None:
        self.commands.append(d.RecordEvent(ev.Event(self.now, kind, reason, f"replica/{r.id}", message,
                                                    model=r.model, node=r.node_id or "")))

    def unhealthy(self, r: ReplicaRecord, node: NodeView, st: ShardStatus) -> None:
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
        grace = self.grace(r)
        if not self.overdue(r):
            seconded = f"; {self.ejected[r.id]}" if r.id in self.ejected else ""
            r.message = (f"unhealthy on node {node.id}: {why}{seconded}; replaced unless it recovers within "
                         f"{grace:.0f}s")
            return
        r.message = f"unhealthy on node {node.id} past its {grace:.0f}s grace: {why}"

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
        for node_id, shard_id in [(m.node_id, m.shard_id) for m in r.members] or [(r.node_id, r.shard_id)]:
            node = self.nodes.get(node_id or "")
            st = node.shards.get(shard_id or "") if node is not None else None
            if node is not None and st is not None and st.state is ShardState.UNHEALTHY \
                    and self.now - node.unhealthy_since.get(st.shard_id, self.now) >= self.grace(r):
                return st
        return None

    def observe_terminating(self, r: ReplicaRecord, node: NodeView, st: ShardStatus | None) -> None:
        shard = r.shard_id or ""
        reason = r.message or "stopping"
        if st is None or st.state in ShardState.terminal():
            self.deleted.add(r.id)
        elif st.state in (ShardState.DRAINED, ShardState.STARTING, ShardState.FETCHING):
            # Idempotent on the agent, and Drained lasts only until it says Stopping;
            # a fetching shard has nothing to drain (its download goes on if another shard shares it).
            self.commands.append(d.StopShard(node.id, shard, reason))
        elif st.state is ShardState.DRAINING:
            if self.now - r.sent_at > self.cfg.drain_timeout_s + self.cfg.resend_s:
                self.commands.append(d.StopShard(node.id, shard, f"{reason} (drain did not finish)"))
        elif self.now - r.sent_at >= self.cfg.resend_s:
            r.sent_at = self.now
            if st.state is ShardState.READY:
                self.commands.append(d.DrainShard(node.id, shard, int(self.cfg.drain_timeout_s)))
            else:
                self.commands.append(d.StopShard(node.id, shard, reason))

    def _member_view(self, m: Member) -> tuple[NodeView | None, ShardStatus | None, float]:
        """A rank's node, its shard's last status there, and how long the node has been gone (0: connected)."""
        node = self.nodes.get(m.node_id)
        st = node.shards.get(m.shard_id) if node is not None else None
        said_gone = st is not None and st.state in ShardState.terminal()
        if node is None:
            return None, None, float("inf")
        if not node.connected and not said_gone:
            return node, st, self.now - node.disconnected_since
        return node, st, 0.0

    def regroup(self, r: ReplicaRecord, rank: Member, why: str, message: str) -> None:
        """Stops every rank but ``rank`` (gone already) and places the group again; not its failure.

        No failure is counted, but the new attempt waits ``backoff_base_s``: the
        surviving ranks hold their GPUs until their engines have exited, and a
        new rank started at once on one of those nodes would be given the GPUs
        an old rank still has memory on.
        """
        self.stop_members(r, why, but=rank.shard_id)
        _unplace(r)
        r.next_attempt_at = self.now + self.cfg.backoff_base_s
        r.message = message

    def observe_group(self, r: ReplicaRecord) -> None:
        """A Starting or Ready group: Ready once every rank is; replaced whole when one rank is lost."""
        spec = self.models.get(r.model)
        serving_before = r.phase is Phase.READY or r.phase is Phase.UNHEALTHY
        ready: list[ShardStatus] = []
        hung: list[tuple[Member, ShardStatus]] = []
        waiting: list[str] = []
        resend: list[Member] = []
        fetching = False
        for m in r.members:
            node, st, gone_for = self._member_view(m)
            if gone_for > self.cfg.node_grace_s:
                self.regroup(r, m, f"rank {m.rank} of its group is gone",
                             f"node {m.node_id} (rank {m.rank}) lost for {gone_for:.0f}s; a group cannot lose "
                             "a rank, so every rank is stopped and the group is placed again")
                return
            if node is None or gone_for:
                waiting.append(f"node {m.node_id} (rank {m.rank}) is not connected; waiting up to "
                               f"{self.cfg.node_grace_s:.0f}s for it before placing the group again")
                continue
            if not node.reported:
                waiting.append(f"waiting for node {m.node_id} (rank {m.rank}) to report")
                continue
            if st is not None and st.adopted and st.state is ShardState.STARTING and serving_before:
                ready.append(st)  # a restarted agent is checking an engine that served all along
                continue
            if st is None and serving_before:
                self.regroup(r, m, f"rank {m.rank} of its group is gone",
                             f"the engine of rank {m.rank} is gone from node {m.node_id}; starting the group again")
                return
            if st is not None and st.state is ShardState.FETCHING:
                fetching = True  # the group's startup timeout waits for its slowest rank's fetch
                waiting.append(fetching_message(m.node_id, st, rank=m.rank))
                continue
            if st is None or st.state is ShardState.STARTING:
                if st is None and (r.sent_at < node.registered_at or self.now - r.sent_at >= self.cfg.resend_s):
                    resend.append(m)
                waiting.append(f"rank {m.rank} starting on node {m.node_id}")
                continue
            if liveness.probe_failing(st):
                # A rank that stopped answering stalls the whole group (the others wait in a collective).
                ready.append(st)
                hung.append((m, st))
                continue
            if st.state is ShardState.READY:
                ready.append(st)
                continue
            if st.state is ShardState.STOPPED:
                why = f" ({st.message})" if st.message else ""
                self.regroup(r, m, f"rank {m.rank} of its group was stopped",
                             f"the engine of rank {m.rank} was stopped on node {m.node_id}{why}; "
                             "starting the group again")
                return
            if st.state is ShardState.FAILED:
                code = f" with code {st.exit_code}" if st.exit_code is not None else ""
                what = st.message or f"engine exited{code}"
                self.stop_members(r, f"rank {m.rank} of its group failed", but=m.shard_id)
                self.fail(r, f"rank {m.rank} on node {m.node_id} failed: {what}", last_output=st.last_output)
                return
            waiting.append(f"rank {m.rank} is {st.state.value} on node {m.node_id}")
        leader = r.members[0]
        serving = (f"serving on node {leader.node_id} (leader of {len(r.members)} ranks on "
                   f"{', '.join(m.node_id for m in r.members)})")
        if hung and len(ready) == len(r.members):
            m, st = hung[0]
            r.phase = Phase.UNHEALTHY
            if st.state is ShardState.UNHEALTHY:
                r.last_output = st.last_output or r.last_output
                r.message = (f"unhealthy: rank {m.rank} on node {m.node_id}: {liveness.reason(st)}; the group is "
                             f"replaced unless it recovers within {self.grace(r):.0f}s")
            else:
                r.message = (f"health probe failing on rank {m.rank} on node {m.node_id}: {liveness.reason(st)}; "
                             "not routed until a probe passes")
            return
        if len(ready) == len(r.members):
            if r.phase is not Phase.READY:
                endpoint = next((st.endpoint for st in ready if st.shard_id == leader.shard_id), "")
                r.phase, r.ready_at, r.failures = Phase.READY, self.now, 0
                r.endpoint, r.last_output = endpoint, ()
            r.message = serving
            return
        if serving_before:
            # A rank's node is within its grace, or a rank is being checked by a
            # restarted agent: the group stays routed meanwhile, as one node would.
            r.message = waiting[0] if waiting else serving
            return
        if fetching:
            r.started_at = self.now
        elif spec is not None and self.now - r.started_at > spec.startup_timeout_s:
            self.fail(r, f"did not become ready within {spec.startup_timeout_s:.0f}s "
                         f"({len(ready)} of {len(r.members)} ranks ready)", stop_shard=True)
            return
        if resend and spec is not None:
            if any(r.sent_at < self.nodes[m.node_id].registered_at for m in resend):
                r.started_at = self.now  # sent on a stream that has gone: the startup clock starts again
            r.sent_at = self.now
            for m in resend:
                self.commands.append(d.StartShard(m.node_id, member_spec(r, spec, m, hub=self.cfg.hub)))
        r.message = f"{len(ready)} of {len(r.members)} ranks ready; {waiting[0]}" if waiting else r.message

    def observe_group_terminating(self, r: ReplicaRecord) -> None:
        """Drains the leader (when it was Ready), then stops every rank; gone once all of them are."""
        reason = r.message or "stopping"
        leader_busy = False
        live: list[tuple[Member, ShardStatus]] = []
        unknown = False
        for m in r.members:
            node, st, gone_for = self._member_view(m)
            if node is None or gone_for > self.cfg.node_grace_s:
                continue  # gone with its node; if the node returns, its shard is an orphan and is stopped
            if gone_for or not node.reported:
                unknown = True
                continue
            if st is None or st.state in ShardState.terminal():
                continue
            live.append((m, st))
            if m.rank == 0 and st.state in (ShardState.READY, ShardState.DRAINING):
                leader_busy = True
        if not live and not unknown:
            self.deleted.add(r.id)
            return
        resend = self.now - r.sent_at >= self.cfg.resend_s
        for m, st in live:
            if m.rank == 0 and st.state is ShardState.READY:
                if resend:
                    self.commands.append(d.DrainShard(m.node_id, m.shard_id, int(self.cfg.drain_timeout_s)))
            elif m.rank == 0 and st.state is ShardState.DRAINING:
                if self.now - r.sent_at > self.cfg.drain_timeout_s + self.cfg.resend_s:
                    self.commands.append(d.StopShard(m.node_id, m.shard_id, f"{reason} (drain did not finish)"))
            elif leader_busy:
                continue  # the leader's requests in flight still need this rank
            elif st.state is not ShardState.STOPPING or resend:
                self.commands.append(d.StopShard(m.node_id, m.shard_id, reason))
        if resend:
            r.sent_at = self.now

    # -- desired counts ------------------------------------------------------------
    def scale(self) -> None:
        live = [r for r in self.work if r.id not in self.deleted and r.phase is not Phase.TERMINATING]
        for r in live:
            if r.model not in self.models:
                self.terminate(r, f"model {r.model} was deleted")
        by_model: dict[str, list[ReplicaRecord]] = {}
        for r in live:
            by_model.setdefault(r.model, []).append(r)
        for name, spec in sorted(self.models.items()):
            self.scale_model(name, spec, by_model.get(name, []))

    def leaving(self, r: ReplicaRecord, fp: str) -> str:
        """Why ``r`` must be replaced (its spec changed, its node is draining), or "" when it may stay."""
        if r.fingerprint != fp:
            return "replaced by a replica with the model's new spec"
        for node_id in [m.node_id for m in r.members] or [r.node_id or ""]:
            node = self.nodes.get(node_id)
            if node is not None and node.draining:
                return f"moved off node {node.id}, which is being drained"
        hung = self.overdue_shard(r)
        if hung is not None:
            where = next((m.node_id for m in r.members if m.shard_id == hung.shard_id), r.node_id)
            return f"unhealthy on node {where} past its {self.grace(r):.0f}s grace: {liveness.reason(hung)}"
        return ""

    def still_hung(self, r: ReplicaRecord) -> bool:
        """A replica being stopped whose engine still fails its probe (so it still holds its node's resources)."""
        for node_id, shard_id in [(m.node_id, m.shard_id) for m in r.members] or [(r.node_id, r.shard_id)]:
            node = self.nodes.get(node_id or "")
            st = node.shards.get(shard_id or "") if node is not None else None
            if st is not None and liveness.probe_failing(st):
                return True
        return False

    def scale_model(self, name: str, spec: ModelSpec, mine: list[ReplicaRecord]) -> None:
        """Scales to ``spec.replicas`` and rolls outdated replicas within the spec's rollout bounds.

        A roll starts new replicas (at most ``replicas + max_surge`` of the model
        at a time, counting outdated ones still terminating, since they hold
        their node's memory and GPUs until they are gone), waits for them to be
        Ready, then drains and stops old ones while at least ``replicas -
        max_unavailable`` stay Ready. Blue/green (all new first) needed twice
        the capacity and fell over on a full cluster; terminating the old ones
        first would drop requests.
        """
        fp = spec.fingerprint()
        current = [r for r in mine if not self.leaving(r, fp)]
        outdated = [r for r in mine if self.leaving(r, fp)]
        desired = spec.replicas
        if len(current) > desired:
            # An Unhealthy one (within its grace) serves nothing: the first to go. Of the Ready ones, the
            # least loaded by the routers' count goes (its drain finishes soonest and moves the fewest
            # requests), the newest on a tie: its prefix cache is the coldest, so the router misses it least.
            order = {Phase.UNHEALTHY: 0, Phase.PENDING: 0, Phase.STARTING: 1, Phase.READY: 2}
            extras = sorted(current, key=lambda r: (order[r.phase], self.load.get(r.id, 0.0), -r.created_at))
            for r in extras[: len(current) - desired]:
                self.terminate(r, f"scaled down to {desired} replicas")
            current = extras[len(current) - desired:]
        surge, unavailable = spec.rollout.surge(desired), spec.rollout.unavailable(desired)
        ready = sum(1 for r in current + outdated if r.phase is Phase.READY)
        kept: list[ReplicaRecord] = []
        hung = [r for r in outdated if self.overdue(r)]
        if hung:
            kept = self.replace_hung(spec, current, hung, surge=surge, reason=lambda r: self.leaving(r, fp))
        hung_ids = {r.id for r in hung}
        # One not serving costs no availability, so it goes first and at once;
        # Ready ones go oldest first while enough others stay Ready.
        for r in sorted((r for r in outdated if r.id not in hung_ids),
                        key=lambda r: (r.phase is Phase.READY, r.created_at, r.id)):
            if r.phase is not Phase.READY:
                self.terminate(r, self.leaving(r, fp))
            elif ready - 1 >= desired - unavailable:
                self.terminate(r, self.leaving(r, fp))
                ready -= 1
            else:
                kept.append(r)
        missing = desired - len(current)
        holding = [r for r in self.terminating.get(name, ()) if r.id not in self.deleted and r.node_id
                   and (self.leaving(r, fp) or self.still_hung(r))]
        if kept or holding:
            missing = min(missing, desired + surge - len(current) - len(kept) - len(holding))
        for _ in range(missing):
            self.created.append(d.CreateReplica(name, fp))

    def replace_hung(self, spec: ModelSpec, current: list[ReplicaRecord], hung: list[ReplicaRecord], *,
                     surge: int, reason: Callable[[ReplicaRecord], str]) -> list[ReplicaRecord]:
        """Stops the hung replicas whose replacements are Ready; the others are kept (and returned).

        Kept, each counts against ``max_surge`` as a roll's old replica does, so its
        replacement is created beside it. The one that has hung longest goes first,
        once the Ready replicas number ``replicas`` less the hung ones still waiting.
        """
        ready = sum(1 for r in current if r.phase is Phase.READY)
        refused = next((r.message for r in current if r.phase is Phase.PENDING and r.message and not r.failures), "")
        kept: list[ReplicaRecord] = []

        def since(r: ReplicaRecord) -> tuple[float, str]:
            st = self.overdue_shard(r)
            node = self.nodes.get(next((m.node_id for m in r.members if st and m.shard_id == st.shard_id),
                                       r.node_id or ""))
            return (node.unhealthy_since.get(st.shard_id, self.now) if node and st else self.now), r.id

        ordered = sorted(hung, key=since)
        for i, r in enumerate(ordered):
            why = reason(r)
            if surge == 0:
                self.terminate(r, f"{why}; stopped first: max_surge 0 leaves no room to start its replacement "
                                  "beside it")
            elif refused:
                self.terminate(r, f"{why}; stopped first, to free its resources: its replacement was refused a "
                                  f"node ({refused})")
            elif ready >= spec.replicas - (len(ordered) - 1 - i):
                self.terminate(r, f"{why}; stopped now that its replacement is Ready")
            else:
                kept.append(r)
                self.note(r, ev.WARNING, "Replacing",
                          f"replacing unhealthy replica {r.id} ({why}): a new replica starts first, and this one "
                          "is stopped once the new one is Ready")
        return kept

    def place_pending(self) -> None:
        """Places pending replicas, higher-priority models first, then oldest first.

        One ledger and one placer serve the whole pass, so what one replica
        takes (threads, memory, GPU indices) is not handed to the next.
        """
        active = [r for r in self.work if r.id not in self.deleted]
        if not any(r.phase is Phase.PENDING and r.model in self.models and r.next_attempt_at <= self.now
                   for r in active):
            # Building the placer indexes every node: three quarters of a pass over 10,000
            # nodes with nothing to place, holding the event loop heartbeats wait on.
            return
        placer = fit.Placer(self.nodes.values(), fit.Ledger(active, self.models), remote=self.remote)
        # Rendezvous ports held by the groups already placed: a second leader on
        # the same node given the same port would meet the first group's ranks.
        position = {st.view.id: st.idx for st in placer.states}
        for r in active:
            if r.members and r.phase in Phase.placed() and r.members[0].node_id in position:
                placer.leader_ports.setdefault(position[r.members[0].node_id], set()).add(r.leader_port)

        def order(r: ReplicaRecord) -> tuple[int, float, str]:
            spec = self.models.get(r.model)
            return (-(spec.priority if spec is not None else 0), r.created_at, r.id)

        for r in sorted(active, key=order):
            if r.phase is not Phase.PENDING or r.model not in self.models:
                continue
            if r.next_attempt_at > self.now:
                continue
            spec = self.models[r.model]
            if spec.resources.nnodes > 1:
                self.place_group(placer, r, spec)
                continue
            result = placer.place(r.model, spec, replica_id=r.id)
            if isinstance(result, fit.Refused):
                r.message, r.gpus = result.message, ()
                continue
            r.phase, r.node_id, r.gpus = Phase.STARTING, result.node_id, result.gpus
            r.memory_bytes, r.memory_estimated = result.memory_bytes, result.memory_estimated
            r.attempt += 1
            r.shard_id = f"{r.id}-{r.attempt}"
            r.started_at = r.sent_at = self.now
            where = f" (GPU {', '.join(map(str, result.gpus))})" if result.gpus else ""
            estimated = (f"; memory estimated from weights: {format_bytes(result.memory_bytes)}"
                         f"{' per GPU' if result.gpus else ''}" if result.memory_estimated else "")
            # A remote source whose metadata could not be read: placed all the same (the hub being
            # offline must not hold a model that states its memory, or one that fits anyway), and
            # the replica says why its memory was not estimated.
            unknown = f"; memory not estimated: {result.metadata_problem}" if result.metadata_problem else ""
            r.endpoint, r.message = "", f"starting on node {result.node_id}{where}{estimated}{unknown}"
            if unknown:
                self.note(r, ev.WARNING, "WeightsMetadataUnknown", result.metadata_problem)
            self.commands.append(d.StartShard(result.node_id, shard_spec(r, spec, hub=self.cfg.hub)))

    def place_group(self, placer: fit.Placer, r: ReplicaRecord, spec: ModelSpec) -> None:
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
        r.started_at = r.sent_at = self.now
        r.endpoint = ""
        r.message = (f"starting {len(r.members)} ranks on fabric {group.fabric} "
                     f"({', '.join(m.node_id for m in r.members)}); leader {leader.node_id} at "
                     f"{group.leader_addr}:{group.leader_port}")
        for m in r.members:
            self.commands.append(d.StartShard(m.node_id, member_spec(r, spec, m, hub=self.cfg.hub)))

    def stop_orphans(self) -> None:
        """Stops live shards no replica wants: left by a replaced attempt, or on a node that came back."""
        wanted = {(r.node_id, r.shard_id) for r in self.work if r.id not in self.deleted and r.shard_id}
        # Every rank of a live group is wanted, not only its leader.
        wanted |= {(m.node_id, m.shard_id) for r in self.work if r.id not in self.deleted for m in r.members}
        asked = {(c.node_id, c.shard_id) for c in self.commands if isinstance(c, d.StopShard)}
        for node in self.nodes.values():
            if not (node.connected and node.reported):
                continue
            for shard_id, st in node.shards.items():
                if st.state in ShardState.live() and st.state is not ShardState.STOPPING \
                        and (node.id, shard_id) not in wanted | asked:
                    self.commands.append(d.StopShard(node.id, shard_id, ORPHAN_REASON))

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
    p = _Pass(models, replicas, nodes, now, cfg, ejected, remote, load)
    for r in p.work:
        if r.phase in Phase.placed():
            p.observe(r)
    p.scale()
    p.place_pending()
    p.stop_orphans()
    return p.result() + weightsgc.collect(models, nodes.values(), free_below_pct=cfg.weights_gc_free_below_pct,
                                          now=now, removing=removing)
