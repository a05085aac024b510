"""Placement of one replica: which node, or why none (pure).

This version places by memory, CPU threads and the engine being installed; GPU
fit comes later. A node's free memory is what it last reported, less what the
replicas already sent to it but not yet Ready will take: those engines are
still loading, so the report does not show their memory yet. Without that, a
burst of replicas all fit on the node that looked free and then run it out of
memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.specs import ModelSpec
from llmgw.core.units import format_bytes

#: How many refused nodes a message names before it summarises the rest.
_NAMED_IN_MESSAGE = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    node_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    #: One sentence a person can act on.
    message: str
    #: node id -> why that node cannot take the replica.
    reasons: Mapping[str, str]


def _reserved(node_id: str, replicas: Iterable[ReplicaRecord], specs: Mapping[str, ModelSpec],
              ) -> tuple[int, int, int]:
    """Memory still to be taken by loading replicas, threads held by all placed ones, model count."""
    memory = threads = 0
    count: dict[str, int] = {}
    for r in replicas:
        if r.node_id != node_id or r.phase not in Phase.placed():
            continue
        spec = specs.get(r.model)
        if spec is None:
            continue
        count[r.model] = count.get(r.model, 0) + 1
        threads += spec.resources.cpu_threads
        if r.phase is Phase.STARTING:
            memory += spec.resources.memory_bytes
    return memory, threads, sum(count.values())


def why_not(spec: ModelSpec, node: NodeView, replicas: Iterable[ReplicaRecord],
            specs: Mapping[str, ModelSpec]) -> str | None:
    """The reason ``node`` cannot take a replica of ``spec``, or None when it can."""
    if not node.connected:
        return "is not connected"
    if spec.engine not in node.inventory.engine_names():
        installed = ", ".join(sorted(node.inventory.engine_names())) or "none"
        return f"lacks engine {spec.engine} (has: {installed})"
    loading_memory, held_threads, _ = _reserved(node.id, replicas, specs)
    need = spec.resources.memory_bytes
    free = node.inventory.memory_available_bytes - loading_memory
    if need and free < need:
        return f"has {format_bytes(max(free, 0))} free memory, needs {format_bytes(need)}"
    threads = spec.resources.cpu_threads
    if threads and node.inventory.cpu_count - held_threads < threads:
        left = max(node.inventory.cpu_count - held_threads, 0)
        return f"has {left} of {node.inventory.cpu_count} CPU threads unclaimed, needs {threads}"
    return None


def place(model: str, spec: ModelSpec, nodes: Iterable[NodeView], replicas: list[ReplicaRecord],
          specs: Mapping[str, ModelSpec]) -> Placed | Refused:
    """Picks the node for one more replica of ``model``: fewest replicas of it, then most free memory.

    Spreading replicas of one model over nodes first is what keeps a model
    serving when one node goes away; memory breaks the tie so that the next
    model lands where there is room to grow.
    """
    candidates: list[tuple[int, int, str]] = []
    reasons: dict[str, str] = {}
    for node in nodes:
        reason = why_not(spec, node, replicas, specs)
        if reason is not None:
            reasons[node.id] = reason
            continue
        same = sum(1 for r in replicas if r.node_id == node.id and r.model == model
                   and r.phase in Phase.placed())
        candidates.append((same, -node.inventory.memory_available_bytes, node.id))
    if candidates:
        return Placed(node_id=min(candidates)[2])
    if not reasons:
        return Refused("no node is registered; start one with `llmgw agent --server HOST:8081`", {})
    named = sorted(reasons.items())[:_NAMED_IN_MESSAGE]
    parts = [f"{node_id} {reason}" for node_id, reason in named]
    if len(reasons) > len(named):
        parts.append(f"and {len(reasons) - len(named)} more nodes cannot either")
    return Refused(f"no node can run a replica of {model}: " + "; ".join(parts), reasons)
