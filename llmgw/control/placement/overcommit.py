"""Over-commit across sleeping replicas (issue 31, ``--sleep-overcommit``): a GPU held only by replicas whose
engines sleep is offered to another replica, within ``capacity × overcommit`` (``core.idle.fits``).

A sleeping engine has given its accelerator memory back (vLLM's sleep mode), so the GPU can run another
model while it sleeps; the bound keeps the sum of every replica on the GPU, asleep or not, within the
setting. Waking one of them later is the idle manager's (``control/loop/sleeper.py``): it puts the least
recently used awake replicas on the GPU to sleep first (``core.idle.wake_plan``). With ``overcommit`` 1 (the
default) nothing is lent: a GPU is one replica's, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.control.placement.ledger import Ledger
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core import idle


def gpu_total(view: NodeView | None, index: int) -> int:
    """A GPU's memory as its node reports it (bytes); 0: not known."""
    if view is None:
        return 0
    return next((g.memory_total_bytes for g in view.inventory.gpus if g.index == index), 0)


def sleep_level(r: ReplicaRecord, nodes: Mapping[str, NodeView]) -> int:
    """The level ``r``'s engine sleeps at as its node reports it; 0: awake (or not Ready, or not heard from)."""
    view = nodes.get(r.node_id or "")
    status = view.shards.get(r.shard_id or "") if view is not None else None
    return status.sleep_level if status is not None and r.phase is Phase.READY else 0


def residents(replicas: Iterable[ReplicaRecord], nodes: Mapping[str, NodeView]
              ) -> dict[tuple[str, int], list[tuple[ReplicaRecord, bool]]]:
    """(node, GPU index) -> the one-node replicas placed on it, each with whether its engine sleeps."""
    out: dict[tuple[str, int], list[tuple[ReplicaRecord, bool]]] = {}
    for r in replicas:
        if r.node_id is None or r.members or r.phase not in Phase.placed():
            continue
        asleep = sleep_level(r, nodes) > 0
        for g in r.gpus:
            out.setdefault((r.node_id, g), []).append((r, asleep))
    return out


def lend(ledger: Ledger, replicas: Iterable[ReplicaRecord], nodes: Mapping[str, NodeView], *,
         overcommit: float) -> list[tuple[str, int]]:
    """Frees in ``ledger`` each GPU whose replicas all sleep and leave room for one more within the bound;
    returns the (node, GPU) pairs lent."""
    if overcommit <= 1.0:
        return []
    lent = []
    for (node_id, index), here in residents(replicas, nodes).items():
        if not all(asleep for _, asleep in here):
            continue
        total = gpu_total(nodes.get(node_id), index)
        if not total:
            continue
        held = [idle.Resident(id=r.id, model=r.model, memory_mib=r.memory_bytes or total, awake=False, last_used=0.0)
                for r, _ in here]
        # The next replica may need the whole GPU: room for that, within the bound, or no loan.
        if idle.fits(total, held, total, overcommit=overcommit):
            ledger.gpus.get(node_id, {}).pop(index, None)
            lent.append((node_id, index))
    return lent
