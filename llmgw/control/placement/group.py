"""A replica that spans several nodes: which nodes, which ranks, which adapters (pure).

The ranks of one replica talk over InfiniBand or RoCE, so they must all be on
one declared fabric (agents declare which adapters are cabled to which fabric:
the wire cannot tell two OpenSM subnets with the default prefix apart). A node
counts for a fabric only with at least one adapter of it usable now (port
ACTIVE and LinkUp); its rank gets those adapters (NCCL_IB_HCA). Rank 0 leads:
the others reach it at its management address and a rendezvous port.

The fabric is chosen by the model's policy: spread takes the fabric with the
most nodes that fit (room for the next replica), binpack the one with the
fewest that still suffice. Within it, nodes go in the same order one-node
replicas would use.

The reconciler (``place_pending``) calls this for a model with nnodes > 1
and starts one shard per rank; the ranks are then started, failed and
stopped together (see ``llmgw.control.reconcile.decide``).
"""

from __future__ import annotations

import dataclasses

from llmgw.control.placement import filters as f
from llmgw.control.placement.explain import Refused, refusal
from llmgw.control.placement.placer import Placer
from llmgw.core.inventory import Gpu, Inventory
from llmgw.core.specs import ModelSpec

#: Where rendezvous ports for group leaders are taken from (torch.distributed's default first).
RENDEZVOUS_PORTS = range(29500, 29600)


@dataclasses.dataclass(frozen=True, slots=True)
class Rank:
    rank: int
    node_id: str
    gpus: tuple[int, ...]
    #: The fabric's usable adapters on this node, for NCCL_IB_HCA.
    hcas: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    fabric: str
    ranks: tuple[Rank, ...]
    #: Rank 0's management address and the port the others rendezvous on.
    leader_addr: str
    leader_port: int
    memory_bytes: int = 0
    memory_estimated: bool = False


def usable_fabrics(inv: Inventory) -> dict[str, tuple[str, ...]]:
    """fabric name -> its adapters on this node that are usable now."""
    state = {h.name: h.usable for h in inv.hcas}
    out: dict[str, tuple[str, ...]] = {}
    for fab in inv.fabrics:
        # An adapter the inventory does not list is taken as the agent declared
        # it: the fabric's list already holds only the usable ones.
        hcas = tuple(h for h in fab.hcas if state.get(h, True))
        if hcas:
            out[fab.name] = hcas
    return out


def place_group(placer: Placer, model: str, spec: ModelSpec, *, replica_id: str = "") -> Group | Refused:
    """Picks ``spec.resources.nnodes`` nodes on one fabric for one replica, and takes their resources."""
    need = placer.need(model, spec)
    refused = placer.engine_refusal(model, spec)
    if refused is not None:
        return refused
    members, _, _ = placer.members(need)
    held = placer.replicas_of(model)
    fitting: dict[str, list[tuple[tuple[int, ...], f.NodeState, list[Gpu], tuple[str, ...]]]] = {}
    no_fabric: dict[str, f.Reason] = {}
    for idx in members:
        st = placer.states[idx]
        free = f.fits(need, st)
        if free is None:
            continue
        fabrics = usable_fabrics(st.view.inventory)
        if not fabrics:
            no_fabric[st.view.id] = f.Reason(f.FABRIC, "has no usable adapter on a declared fabric")
            continue
        if need.policy == "binpack":
            key: tuple[int, ...] = (st.unheld_gpus, st.free_memory, idx)
        else:
            key = (held.get(idx, 0), -st.unheld_gpus, -st.free_memory, idx)
        for name, hcas in fabrics.items():
            fitting.setdefault(name, []).append((key, st, free, hcas))
    big_enough = [name for name, nodes in fitting.items() if len(nodes) >= need.nnodes]
    if not big_enough:
        reasons = placer.reasons(need)
        reasons.update(no_fabric)
        for name, nodes in fitting.items():
            for _, st, _, _ in nodes:
                reasons[st.view.id] = f.Reason(
                    f.FABRIC, f"is on fabric {name}, which has {len(nodes)} of the {need.nnodes} nodes needed",
                    len(nodes))
        return refusal(need, reasons, what="a multi-node replica")
    sign = 1 if need.policy == "binpack" else -1
    fabric = min(big_enough, key=lambda name: (sign * len(fitting[name]), name))
    chosen = sorted(fitting[fabric], key=lambda entry: entry[0])[: need.nnodes]
    leader = chosen[0][1]
    used = placer.leader_ports.setdefault(leader.idx, set())
    port = next((p for p in RENDEZVOUS_PORTS if p not in used), 0)
    if not port:
        # Asked before anything is taken, so a refusal leaves the pass's resources as they were.
        return Refused(f"node {leader.view.id} leads {len(RENDEZVOUS_PORTS)} multi-node replicas already, one "
                       f"per rendezvous port {RENDEZVOUS_PORTS[0]}-{RENDEZVOUS_PORTS[-1]}; no replica of {model} "
                       "can lead there until one of them is gone", {})
    used.add(port)
    ranks = []
    for rank, (_, st, free, hcas) in enumerate(chosen):
        placed = placer.take(st, need, free, replica_id=replica_id)
        ranks.append(Rank(rank, st.view.id, placed.gpus, hcas))
    return Group(fabric, tuple(ranks), leader.view.mgmt_addr or leader.view.id, port,
                 need.placed_memory, need.memory_estimated)
