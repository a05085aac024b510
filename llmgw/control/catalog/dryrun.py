"""Where a model would be placed now, and why every other node would not take it: the placer's own answer,
asked on a copy of this moment's state (the nodes as last reported, the replicas placed), with nothing applied,
stored or sent. Pure: the caller gives the snapshot.

The same ``Placer`` and ``Ledger`` a pass builds (``control.reconcile.place``), so the reasons are the placer's
words ("has 3.2 GiB free memory, needs 40.0 GiB", "lacks engine vllm (has: llamacpp, sim)"), not a second
opinion that could disagree with what happens at apply. Two things it cannot know: replicas a pass places
between the preview and the apply, and an engine install the model's ``engine_version`` would start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from llmgw.control.placement import fit
from llmgw.control.placement.needs import RemoteWeights
from llmgw.control.state import NodeView, ReplicaRecord
from llmgw.core.specs import ModelSpec


@dataclasses.dataclass(frozen=True, slots=True)
class NodeAnswer:
    node: str
    #: Replicas of the model the preview puts here (0: none).
    replicas: int
    #: GPU indices given to the first replica here, if any.
    gpus: tuple[int, ...]
    #: Why the node takes none ("" when it takes some, or could: ``fits``).
    reason: str
    #: It could take a replica, though the placer chose another node (spread, binpack).
    fits: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Preview:
    #: Replicas placed of those asked for.
    placed: int
    wanted: int
    #: The placer's sentence when some replica fits nowhere ("" when all are placed).
    message: str
    #: Memory each replica was placed with (per GPU for a GPU model), and whether it is the estimate.
    memory_bytes: int
    memory_estimated: bool
    #: Every node: those it lands on first, then those that fit, then the rest; by name within each.
    nodes: tuple[NodeAnswer, ...]

    def doc(self) -> dict[str, Any]:
        return {"placed": self.placed, "wanted": self.wanted, "message": self.message,
                "memory_bytes": self.memory_bytes, "memory_estimated": self.memory_estimated,
                "nodes": [dataclasses.asdict(n) | {"gpus": list(n.gpus)} for n in self.nodes]}


def preview(name: str, spec: ModelSpec, nodes: Iterable[NodeView], replicas: Iterable[ReplicaRecord],
            models: Mapping[str, ModelSpec], remote: Mapping[str, RemoteWeights] | None = None) -> Preview:
    """Where ``spec``'s replicas would go as ``name`` among ``models`` (its current version left out), and why each
    other node would not take one."""
    views = list(nodes)
    others = {m: s for m, s in models.items() if m != name}
    # This model's own replicas (an update previewed) are not counted against it: the apply rolls them.
    placed_now = [r for r in replicas if r.model != name]
    ledger = fit.Ledger(placed_now, others)
    # Why each node cannot take one now, asked before anything is taken: the placer's reasons per node.
    before = fit.Placer(views, ledger, remote=remote)
    need = before.need(name, spec)
    refused = before.engine_refusal(name, spec)
    reasons = {} if refused is not None else {k: r.text for k, r in before.reasons(need).items()}
    placer = fit.Placer(views, fit.Ledger(placed_now, others), remote=remote)
    counts: dict[str, int] = {}
    gpus: dict[str, tuple[int, ...]] = {}
    message, memory, estimated = "", 0, False
    for i in range(spec.replicas):
        got = placer.place(name, spec, replica_id=f"preview-{i}")
        if isinstance(got, fit.Refused):
            message = got.message
            break
        counts[got.node_id] = counts.get(got.node_id, 0) + 1
        gpus.setdefault(got.node_id, got.gpus)
        memory, estimated = got.memory_bytes, got.memory_estimated
    if not counts:
        memory, estimated = need.placed_memory, need.memory_estimated
    answers = []
    for view in sorted(views, key=lambda v: v.id):
        if refused is not None:
            why = refused.message
        else:
            why = reasons.get(view.id, "")
        answers.append(NodeAnswer(view.id, counts.get(view.id, 0), gpus.get(view.id, ()),
                                  "" if counts.get(view.id) else why,
                                  not counts.get(view.id) and not why))
    # The nodes it lands on first, then those that would take it too, then the rest, each by name.
    answers.sort(key=lambda a: (not a.replicas, not a.fits, a.node))
    return Preview(sum(counts.values()), spec.replicas, message, memory, estimated, tuple(answers))
