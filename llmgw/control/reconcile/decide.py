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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from llmgw.control.placement import fit
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.core.specs import ModelSpec
from llmgw.core.units import format_bytes

#: The reason a StopShard for a shard no replica wants gives (the events log tells these apart).
ORPHAN_REASON = "no replica wants this shard"


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


def backoff(failures: int, cfg: Config) -> float:
    """Seconds to wait before the next attempt after ``failures`` failures in a row."""
    if failures <= 0:
        return 0.0
    return min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (failures - 1))


def shard_spec(r: ReplicaRecord, spec: ModelSpec) -> ShardSpec:
    assert r.shard_id is not None
    return ShardSpec(
        shard_id=r.shard_id, replica_id=r.id, model=r.model, engine=spec.engine,
        served_name=spec.served_name, source=spec.source, args=spec.engine_args, api_key=r.api_key,
        threads=spec.resources.cpu_threads, memory_bytes=spec.resources.memory_bytes,
        startup_timeout_s=int(spec.startup_timeout_s), env=spec.env, gpus=r.gpus,
    )


class _Pass:
    """One reconcile pass: a working copy of the replicas and the decisions so far."""

    def __init__(self, models: Mapping[str, ModelSpec], replicas: list[ReplicaRecord],
                 nodes: Mapping[str, NodeView], now: float, cfg: Config) -> None:
        self.models, self.nodes, self.now, self.cfg = models, nodes, now, cfg
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
        if stop_shard and r.node_id and r.shard_id:
            self.commands.append(d.StopShard(r.node_id, r.shard_id, reason))
        r.failures += 1
        delay = backoff(r.failures, self.cfg)
        where = f" on node {r.node_id}" if r.node_id else ""
        if r.failures >= self.cfg.crash_loop_after:
            r.message = (f"crash loop: failed {r.failures} times in a row{where}; last: {reason}; "
                         f"next try in {delay:.0f}s")
        else:
            r.message = f"{reason}{where}; next try in {delay:.0f}s (failure {r.failures} in a row)"
        r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
        r.next_attempt_at = self.now + delay
        if last_output:
            r.last_output = last_output

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
            self.commands.append(d.DrainShard(r.node_id, r.shard_id, int(self.cfg.drain_timeout_s)))
        else:
            self.commands.append(d.StopShard(r.node_id, r.shard_id, reason))

    # -- observation -------------------------------------------------------------
    def observe(self, r: ReplicaRecord) -> None:
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
        if st is not None and st.adopted and st.state is ShardState.STARTING and r.phase is Phase.READY:
            # A restarted agent found this engine running and is checking it;
            # it has served all along, so it stays Ready (and routed) meanwhile.
            # If the check fails the agent reports it Failed, and it is replaced.
            return
        if st is None and r.phase is Phase.READY:
            # The node registered with its full list and this shard is not on
            # it: the engine is gone (the agent was restarted and could not
            # keep it). Not the replica's failure, so no backoff.
            r.phase, r.node_id, r.shard_id, r.endpoint = Phase.PENDING, None, None, ""
            r.next_attempt_at = self.now
            r.message = f"its engine is gone from node {node.id}; starting a new one"
            return
        if st is None or st.state is ShardState.STARTING:
            if st is None and spec is not None and r.sent_at < node.registered_at:
                # Sent on a stream that has since gone, so it may never have
                # arrived: send it again now, and the startup clock starts
                # again with it. Without the reset, a replica placed just
                # before a restart was failed for a timeout at once (seen on a
                # second `make up`: "did not become ready within 300s").
                r.sent_at = r.started_at = self.now
                self.commands.append(d.StartShard(node.id, shard_spec(r, spec)))
                return
            if spec is not None and self.now - r.started_at > spec.startup_timeout_s:
                self.fail(r, f"did not become ready within {spec.startup_timeout_s:.0f}s", stop_shard=True)
            elif st is None and spec is not None and self.now - r.sent_at >= self.cfg.resend_s:
                r.sent_at = self.now
                self.commands.append(d.StartShard(node.id, shard_spec(r, spec)))
            elif st is not None:
                r.message, r.endpoint = f"starting on node {node.id}", st.endpoint
            return
        if st.state is ShardState.READY:
            if r.phase is not Phase.READY:
                r.phase, r.ready_at, r.failures = Phase.READY, self.now, 0
                r.endpoint, r.message, r.last_output = st.endpoint, f"serving on node {node.id}", ()
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

    def observe_terminating(self, r: ReplicaRecord, node: NodeView, st: ShardStatus | None) -> None:
        shard = r.shard_id or ""
        reason = r.message or "stopping"
        if st is None or st.state in ShardState.terminal():
            self.deleted.add(r.id)
        elif st.state is ShardState.DRAINED or st.state is ShardState.STARTING:
            # Idempotent on the agent, and Drained lasts only until it says Stopping.
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
        node = self.nodes.get(r.node_id or "")
        if node is not None and node.draining:
            return f"moved off node {node.id}, which is being drained"
        return ""

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
            order = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.READY: 2}
            extras = sorted(current, key=lambda r: (order[r.phase], -r.created_at))
            for r in extras[: len(current) - desired]:
                self.terminate(r, f"scaled down to {desired} replicas")
            current = extras[len(current) - desired:]
        surge, unavailable = spec.rollout.surge(desired), spec.rollout.unavailable(desired)
        ready = sum(1 for r in current + outdated if r.phase is Phase.READY)
        kept: list[ReplicaRecord] = []
        # One not serving costs no availability, so it goes first and at once;
        # Ready ones go oldest first while enough others stay Ready.
        for r in sorted(outdated, key=lambda r: (r.phase is Phase.READY, r.created_at, r.id)):
            if r.phase is not Phase.READY:
                self.terminate(r, self.leaving(r, fp))
            elif ready - 1 >= desired - unavailable:
                self.terminate(r, self.leaving(r, fp))
                ready -= 1
            else:
                kept.append(r)
        missing = desired - len(current)
        holding = [r for r in self.terminating.get(name, ()) if r.id not in self.deleted and r.node_id
                   and self.leaving(r, fp)]
        if kept or holding:
            missing = min(missing, desired + surge - len(current) - len(kept) - len(holding))
        for _ in range(missing):
            self.created.append(d.CreateReplica(name, fp))

    def place_pending(self) -> None:
        """Places pending replicas, higher-priority models first, then oldest first.

        One ledger and one placer serve the whole pass, so what one replica
        takes (threads, memory, GPU indices) is not handed to the next.
        """
        active = [r for r in self.work if r.id not in self.deleted]
        placer = fit.Placer(self.nodes.values(), fit.Ledger(active, self.models))

        def order(r: ReplicaRecord) -> tuple[int, float, str]:
            spec = self.models.get(r.model)
            return (-(spec.priority if spec is not None else 0), r.created_at, r.id)

        for r in sorted(active, key=order):
            if r.phase is not Phase.PENDING or r.model not in self.models:
                continue
            if r.next_attempt_at > self.now:
                continue
            spec = self.models[r.model]
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
            r.endpoint, r.message = "", f"starting on node {result.node_id}{where}{estimated}"
            self.commands.append(d.StartShard(result.node_id, shard_spec(r, spec)))

    def stop_orphans(self) -> None:
        """Stops live shards no replica wants: left by a replaced attempt, or on a node that came back."""
        wanted = {(r.node_id, r.shard_id) for r in self.work if r.id not in self.deleted and r.shard_id}
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
              nodes: Mapping[str, NodeView], *, now: float, cfg: Config = Config()) -> list[d.Decision]:
    """Everything that should be done now to move the observed world toward the desired one."""
    p = _Pass(models, replicas, nodes, now, cfg)
    for r in p.work:
        if r.phase in Phase.placed():
            p.observe(r)
    p.scale()
    p.place_pending()
    p.stop_orphans()
    return p.result()
