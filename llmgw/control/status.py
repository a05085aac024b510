"""A model's state in one word and one sentence, from its replicas (pure).

The router puts the sentence in its 503, so it must tell a person what is
happening and what to look at, not only that nothing is Ready.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.shards import ShardState
from llmgw.core.specs import ModelSpec


@dataclasses.dataclass(frozen=True, slots=True)
class ModelStatus:
    #: Ready, Degraded, ScalingUp (autoscaled, its new replicas starting), Starting, Pending, Failed, ScaledToZero,
    #: or Cold (autoscaled, at zero).
    state: str
    message: str
    ready: int
    desired: int


def fetch_of(r: ReplicaRecord, nodes: Mapping[str, NodeView]) -> dict[str, Any] | None:
    """How far the fetch of ``r``'s weights is, as its node last reported (a group: its leader's); None unless fetching
    (an adapter's, while Ready: ``agent/supervisor/lorafiles.fetch_shown``).

    Read from the node's live report, never stored: progress changes every
    second, and the replica's record is written only when its target changes.
    """
    view = nodes.get(r.node_id or "")
    st = view.shards.get(r.shard_id or "") if view is not None else None
    if st is None or st.state not in (ShardState.FETCHING, ShardState.READY) or st.fetch is None:
        return None
    return dataclasses.asdict(st.fetch)


def adapters_of(r: ReplicaRecord, nodes: Mapping[str, NodeView]) -> list[str]:
    """The LoRA adapters ``r``'s engine holds, as its node last reported (a group: its leader's)."""
    view = nodes.get(r.node_id or "")
    st = view.shards.get(r.shard_id or "") if view is not None else None
    return list(st.adapters) if st is not None else []


def describe_replica(r: ReplicaRecord, *, now: float) -> str:
    if r.phase is Phase.STARTING:
        return f"replica {r.id} Starting on node {r.node_id} for {now - r.started_at:.0f}s"
    if r.phase is Phase.PENDING and r.next_attempt_at > now:
        return f"replica {r.id} Pending: {r.message}"
    return f"replica {r.id} {r.phase.value}: {r.message}" if r.message else f"replica {r.id} {r.phase.value}"


def cold_message(spec: ModelSpec) -> str:
    """What an autoscaled model at zero says (the router's 503 past its cold-start timeout carries it)."""
    auto = spec.autoscale
    assert auto is not None
    return (f"no replica: scaled to zero after {auto.scale_to_zero_after_s:g}s idle; the next request starts one "
            f"(cold start, up to {auto.cold_start_timeout_s:g}s)")


def scaling_up(spec: ModelSpec, not_ready: Iterable[ReplicaRecord]) -> bool:
    """An autoscaled model's missing replicas are new ones on their way (starting, or created and not yet tried).

    Read as trouble ("Degraded", "ReplicasUnavailable") every scale-up looked like a fault while the model
    served as before. A replica that failed, or that placement refused, is trouble still.
    """
    return spec.autoscale is not None and all(
        r.phase is Phase.STARTING or (r.phase is Phase.PENDING and not r.failures and not r.message)
        for r in not_ready)


def summarize(spec: ModelSpec, replicas: Iterable[ReplicaRecord], *, now: float) -> ModelStatus:
    """The model's state; ``spec.replicas`` is the count in force (the autoscaler's, for an autoscaled model)."""
    mine = [r for r in replicas if r.phase is not Phase.TERMINATING]
    ready = sum(1 for r in mine if r.phase is Phase.READY)
    desired = spec.replicas
    if desired == 0 and spec.autoscale is not None:
        return ModelStatus("Cold", cold_message(spec), ready, desired)
    if desired == 0:
        return ModelStatus("ScaledToZero", "replicas is 0; set spec.replicas to serve it", ready, desired)
    head = f"{ready} of {desired} replicas Ready"
    if ready >= desired:
        return ModelStatus("Ready", head, ready, desired)
    waiting = [r for r in mine if r.phase is not Phase.READY]
    detail = "; ".join(describe_replica(r, now=now) for r in waiting[:3])
    message = f"{head}: {detail}" if detail else head
    if ready and scaling_up(spec, waiting):
        return ModelStatus("ScalingUp", f"{head}: the autoscaler raised the count; {detail}", ready, desired)
    if ready:
        return ModelStatus("Degraded", message, ready, desired)
    if any(r.phase is Phase.STARTING for r in mine):
        return ModelStatus("Starting", message, ready, desired)
    if any(r.failures for r in mine):
        return ModelStatus("Failed", message, ready, desired)
    return ModelStatus("Pending", message, ready, desired)


def sleep_level_of(r: ReplicaRecord, nodes: Mapping[str, NodeView]) -> int:
    """The level a Ready replica's engine sleeps at, as its node last reported it (spec.idle); 0: awake."""
    view = nodes.get(r.node_id or "")
    status = view.shards.get(r.shard_id or "") if view is not None else None
    return status.sleep_level if status is not None and r.phase is Phase.READY else 0
