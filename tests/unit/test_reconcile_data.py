"""Plain-data builders shared by the test_reconcile* files (no tests here): one-node replicas and groups."""

from __future__ import annotations

import dataclasses

from test_placement_data import gpu, hca, ib_fabric, node, spec

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec

S = ShardState
CFG = decide.Config(node_grace_s=30, resend_s=10, backoff_base_s=2, backoff_max_s=60, crash_loop_after=3)
NOW = 1000.0

# -- one-node replicas ------------------------------------------------------------------
SPEC = ModelSpec(engine="sim", served_name="m", startup_timeout_s=100)
FP = SPEC.fingerprint()


def one_node(nid: str = "n1", *, shards: dict[str, ShardState] | None = None, connected: bool = True,
             since: float = 0.0) -> NodeView:
    inv = Inventory(cpu_count=4, memory_total_bytes=8 << 30, memory_available_bytes=4 << 30,
                    engines=(("sim", "1"),))
    sts = {sid: ShardStatus(sid, sid.rsplit("-", 1)[0], st, endpoint="http://h:1", exit_code=3
                            if st is ShardState.FAILED else None, message="boom" if st is ShardState.FAILED else "")
           for sid, st in (shards or {}).items()}
    return NodeView(nid, inv, connected=connected, disconnected_since=since, shards=sts, reported=connected)


def rep(phase: Phase = Phase.PENDING, **kw: object) -> ReplicaRecord:
    base = ReplicaRecord(id="r1", model="m", fingerprint=FP, phase=phase, api_key="k")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run(replicas: list[ReplicaRecord], nodes: list[NodeView], *, now: float = NOW,
        models: dict[str, ModelSpec] | None = None) -> list[d.Decision]:
    return decide.reconcile({"m": SPEC} if models is None else models, replicas, {n.id: n for n in nodes},
                            now=now, cfg=CFG)


# -- groups (a replica over two nodes) ----------------------------------------------------
GROUP_SPEC = spec(gpus=2, nnodes=2)
GROUP_FP = GROUP_SPEC.fingerprint()


def ib_node(nid: str, fabric: str = "ib-a", *adapters: str, shards: dict[str, ShardState] | None = None,
            connected: bool = True, since: float = 0.0, gpus: int = 2, draining: bool = False) -> NodeView:
    adapters = adapters or ("mlx5_0",)
    v = node(nid, gpus=tuple(gpu(i) for i in range(gpus)), fabrics=(ib_fabric(fabric, *adapters),),
             hcas=tuple(hca(a) for a in adapters), mgmt_addr=f"10.0.0.{nid[-1]}", connected=connected)
    sts = {sid: ShardStatus(sid, "r1", st, endpoint=f"http://{nid}:8000", exit_code=3 if st is S.FAILED else None,
                            message="boom" if st is S.FAILED else "", last_output=("oom",) if st is S.FAILED else ())
           for sid, st in (shards or {}).items()}
    return dataclasses.replace(v, shards=sts, disconnected_since=since, draining=draining)


def group(phase: Phase = Phase.STARTING, *, attempt: int = 1, **kw: object) -> ReplicaRecord:
    """A group of two ranks on n1 (leader) and n2, as place_pending leaves it."""
    members = (Member(0, "n1", f"r1-{attempt}-0", (0, 1), ("mlx5_0",)),
               Member(1, "n2", f"r1-{attempt}-1", (0, 1), ("mlx5_0",)))
    base = ReplicaRecord("r1", "m", GROUP_FP, phase, "k", node_id="n1", shard_id=f"r1-{attempt}-0", gpus=(0, 1),
                         attempt=attempt, started_at=990, sent_at=990, members=members, leader_addr="10.0.0.1",
                         leader_port=29500)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def run_group(replicas: list[ReplicaRecord], nodes: list[NodeView], *, now: float = NOW,
              models: dict[str, object] | None = None) -> list[d.Decision]:
    return decide.reconcile({"m": GROUP_SPEC} if models is None else models, replicas,  # type: ignore[arg-type]
                            {n.id: n for n in nodes}, now=now, cfg=CFG)


# -- reading what was decided --------------------------------------------------------------
def updates(out: list[d.Decision]) -> dict[str, ReplicaRecord]:
    return {x.record.id: x.record for x in out if isinstance(x, d.UpdateReplica)}


def commands(out: list[d.Decision], kind: type) -> list[tuple[str, str]]:
    return [(x.node_id, x.spec.shard_id if isinstance(x, d.StartShard) else x.shard_id)  # type: ignore[attr-defined]
            for x in out if isinstance(x, kind)]
