"""Rollout: each model's replica count, rolls to a new spec, nodes being drained, and hung replicas replaced.

A replica must leave (``leaving``) when its model's spec changed, when one of
its nodes is being drained, or when it has been Unhealthy past its grace
(``liveness`` says what counts as evidence). It is replaced as a roll replaces
an outdated replica: the replacement is created within ``max_surge``, and the
old one is drained (a hung one stopped) once enough others are Ready.

A hung replica is stopped with StopShard, never Drain: a hung engine never
finishes its requests, and the agent SIGKILLs it after its stop grace, since a
stopped process ignores SIGTERM. Until its replacement is Ready it keeps its
node's resources, so the replacement is not placed onto the GPU that may be
what wedged it. With ``max_surge`` 0 there is no room for a replacement beside
it, and waiting would wait for ever: it is stopped at once and replaced in its
place; likewise when the replacement was refused a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llmgw.control import events as ev
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile import liveness
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core.specs import ModelSpec

if TYPE_CHECKING:
    from llmgw.control.reconcile.decide import Pass


def scale(p: Pass) -> None:
    """Terminates the replicas of deleted models, then scales and rolls every model in name order."""
    live = [r for r in p.work if r.id not in p.deleted and r.phase is not Phase.TERMINATING]
    for r in live:
        if r.model not in p.models:
            p.terminate(r, f"model {r.model} was deleted")
    by_model: dict[str, list[ReplicaRecord]] = {}
    for r in live:
        by_model.setdefault(r.model, []).append(r)
    for name, spec in sorted(p.models.items()):
        scale_model(p, name, spec, by_model.get(name, []))


def leaving(p: Pass, r: ReplicaRecord, fp: str) -> str:
    """Why ``r`` must be replaced (its spec changed, its node is draining), or "" when it may stay."""
    if r.fingerprint != fp:
        return "replaced by a replica with the model's new spec"
    for node_id in [m.node_id for m in r.members] or [r.node_id or ""]:
        node = p.nodes.get(node_id)
        if node is not None and node.draining:
            return f"moved off node {node.id}, which is being drained"
    hung = p.overdue_shard(r)
    if hung is not None:
        where = next((m.node_id for m in r.members if m.shard_id == hung.shard_id), r.node_id)
        return f"unhealthy on node {where} past its {p.grace(r):.0f}s grace: {liveness.reason(hung)}"
    return ""


def scale_model(p: Pass, name: str, spec: ModelSpec, mine: list[ReplicaRecord]) -> None:
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
    current = [r for r in mine if not leaving(p, r, fp)]
    outdated = [r for r in mine if leaving(p, r, fp)]
    desired = spec.replicas
    if len(current) > desired:
        current = _scale_down(p, current, desired)
    surge, unavailable = spec.rollout.surge(desired), spec.rollout.unavailable(desired)
    ready = sum(1 for r in current + outdated if r.phase is Phase.READY)
    kept: list[ReplicaRecord] = []
    hung = [r for r in outdated if p.overdue(r)]
    if hung:
        kept = replace_hung(p, spec, current, hung, surge=surge, reason=lambda r: leaving(p, r, fp))
    hung_ids = {r.id for r in hung}
    # One not serving costs no availability, so it goes first and at once;
    # Ready ones go oldest first while enough others stay Ready.
    for r in sorted((r for r in outdated if r.id not in hung_ids),
                    key=lambda r: (r.phase is Phase.READY, r.created_at, r.id)):
        if r.phase is not Phase.READY:
            p.terminate(r, leaving(p, r, fp))
        elif ready - 1 >= desired - unavailable:
            p.terminate(r, leaving(p, r, fp))
            ready -= 1
        else:
            kept.append(r)
    missing = desired - len(current)
    holding = [r for r in p.terminating.get(name, ()) if r.id not in p.deleted and r.node_id
               and (leaving(p, r, fp) or p.still_hung(r))]
    if kept or holding:
        missing = min(missing, desired + surge - len(current) - len(kept) - len(holding))
    for _ in range(missing):
        p.created.append(d.CreateReplica(name, fp))


def _scale_down(p: Pass, current: list[ReplicaRecord], desired: int) -> list[ReplicaRecord]:
    """Terminates the extra replicas; returns those that stay.

    An Unhealthy one (within its grace) serves nothing: the first to go. Of the Ready ones, the
    least loaded by the routers' count goes (its drain finishes soonest and moves the fewest
    requests), the newest on a tie: its prefix cache is the coldest, so the router misses it least.
    """
    order = {Phase.UNHEALTHY: 0, Phase.PENDING: 0, Phase.STARTING: 1, Phase.READY: 2}
    extras = sorted(current, key=lambda r: (order[r.phase], p.load.get(r.id, 0.0), -r.created_at))
    for r in extras[: len(current) - desired]:
        p.terminate(r, f"scaled down to {desired} replicas")
    return extras[len(current) - desired:]


def replace_hung(p: Pass, spec: ModelSpec, current: list[ReplicaRecord], hung: list[ReplicaRecord], *,
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
        st = p.overdue_shard(r)
        node = p.nodes.get(next((m.node_id for m in r.members if st and m.shard_id == st.shard_id),
                                r.node_id or ""))
        return (node.unhealthy_since.get(st.shard_id, p.now) if node and st else p.now), r.id

    ordered = sorted(hung, key=since)
    for i, r in enumerate(ordered):
        why = reason(r)
        if surge == 0:
            p.terminate(r, f"{why}; stopped first: max_surge 0 leaves no room to start its replacement "
                           "beside it")
        elif refused:
            p.terminate(r, f"{why}; stopped first, to free its resources: its replacement was refused a "
                           f"node ({refused})")
        elif ready >= spec.replicas - (len(ordered) - 1 - i):
            p.terminate(r, f"{why}; stopped now that its replacement is Ready")
        else:
            kept.append(r)
            p.note(r, ev.WARNING, "Replacing",
                   f"replacing unhealthy replica {r.id} ({why}): a new replica starts first, and this one "
                   "is stopped once the new one is Ready")
    return kept
