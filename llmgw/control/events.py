"""Events: what happened to a model, a replica or a node, one line each (pure).

The reconciler's decisions say what to do; events say what was done and what
was seen, for ``llmgw events`` and ``llmgw describe``. They are derived from
the difference between a replica's target before and after a pass, so every
move is told once however often a pass repeats a command (a StopShard resent
every ten seconds is one "Terminating" event, not one a resend).
"""

from __future__ import annotations

import dataclasses

from llmgw.control import conditions as cond
from llmgw.control.state import Phase, ReplicaRecord

NORMAL, WARNING = "Normal", "Warning"


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    time: float
    #: Normal or Warning.
    kind: str
    #: CamelCase.
    reason: str
    #: "model/NAME", "replica/ID" or "node/ID".
    object: str
    message: str
    #: The model the object belongs to, and the node it is on, for filtering ("" when none).
    model: str = ""
    node: str = ""
    #: Assigned by the store.
    id: int = 0


def replica_events(before: ReplicaRecord | None, after: ReplicaRecord | None, *, now: float,
                   crash_loop_after: int) -> list[Event]:
    """What changed for one replica in a pass; ``None`` on a side means created or deleted."""
    r = after or before
    if r is None:
        return []

    def ev(kind: str, reason: str, message: str) -> Event:
        return Event(now, kind, reason, f"replica/{r.id}", message, model=r.model, node=r.node_id or "")

    if before is None:
        return [ev(NORMAL, "Created", f"replica of model {r.model} created (spec {r.fingerprint})")]
    if after is None:
        where = f" from node {before.node_id}" if before.node_id else ""
        return [ev(NORMAL, "Deleted", f"removed{where}")]
    if after.failures > before.failures:
        reason = "CrashLoop" if after.failures >= crash_loop_after else "Failed"
        tail = [x for x in after.last_output if x.strip()][-1:]
        out = f" (last output: {tail[0]})" if tail else ""
        e = ev(WARNING, reason, f"{after.message}{out}")
        return [dataclasses.replace(e, node=before.node_id or "")]
    if after.phase is Phase.UNHEALTHY and after.message != before.message:
        # Each step is told: out of routing (a first failed probe), Unhealthy (the agent's
        # threshold, with its reason), past its grace; a message holds no clock, so a pass
        # that changes nothing says nothing.
        return [ev(WARNING, "Unhealthy", f"replica {r.id} {after.message}")]
    if before.phase is Phase.UNHEALTHY and after.phase is Phase.READY:
        return [ev(NORMAL, "Recovered", f"replica {r.id} recovered: its health probe passes again on node "
                                        f"{after.node_id}; routed again")]
    if after.phase is before.phase:
        if after.phase is Phase.PENDING and after.message and after.message != before.message \
                and not after.failures:
            return [ev(WARNING, "FailedScheduling", after.message)]
        return []
    if after.phase is Phase.STARTING:
        return [ev(NORMAL, "Scheduled", f"placed on node {after.node_id} as shard {after.shard_id}")]
    if after.phase is Phase.READY:
        return [ev(NORMAL, "Ready", f"serving on node {after.node_id} at {after.endpoint}")]
    if after.phase is Phase.TERMINATING:
        return [ev(NORMAL, "Terminating", after.message or "being stopped")]
    e = ev(WARNING, "Rescheduled", after.message or f"off node {before.node_id}; placing it again")
    return [dataclasses.replace(e, node=before.node_id or "")]


def condition_events(obj: str, model: str, new: tuple[cond.Condition, ...],
                     previous: tuple[cond.Condition, ...], *, now: float) -> list[Event]:
    """One event per condition whose status changed: Warning when it changed to the bad side."""
    out = []
    for c in cond.transitions(new, previous):
        kind = WARNING if cond.BAD_STATUS.get(c.type) == c.status else NORMAL
        out.append(Event(now, kind, c.reason, obj, f"{c.type} is {c.status}: {c.message}", model=model))
    return out
