"""Plain-data builders shared by the test_placement* files (no tests here)."""

from __future__ import annotations

from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Fabric, Gpu, Hca, HcaPort, Inventory, WeightFile
from llmgw.core.specs import Gpus, ModelSpec, Resources

GIB = 2**30


def gpu(index: int, *, used_gib: float = 0, total_gib: float = 80, cc: str = "9.0", peers: tuple[int, ...] = (),
        bus: str = "") -> Gpu:
    return Gpu(index, f"GPU-{index}", "H100", int(total_gib * GIB), int(used_gib * GIB), cc, peers, bus)


def node(nid: str, *, free_gib: float = 8, cpus: int = 8, engines: tuple[str, ...] = ("sim", "llamacpp"),
         versions: dict[str, str] | None = None, connected: bool = True, cordoned: bool = False,
         labels: dict[str, str] | None = None, gpus: tuple[Gpu, ...] = (), weights: tuple[WeightFile, ...] = (),
         fabrics: tuple[Fabric, ...] = (), hcas: tuple[Hca, ...] = (), mgmt_addr: str = "") -> NodeView:
    versions = versions or {}
    inv = Inventory(cpu_count=cpus, memory_total_bytes=64 * GIB, memory_available_bytes=int(free_gib * GIB),
                    engines=tuple((e, versions.get(e, "1")) for e in engines), gpus=gpus, weights=weights,
                    fabrics=fabrics, hcas=hcas)
    return NodeView(nid, inv, connected=connected, reported=connected, cordoned=cordoned, labels=labels or {},
                    mgmt_addr=mgmt_addr)


def spec(*, engine: str = "sim", memory_gib: float = 0, threads: int = 0, gpus: int = 0, gpu_gib: float = 0,
         cc: str = "", tp: int = 0, nnodes: int = 1, placement: str = "spread", source: str = "",
         version: str = "", pool: str = "", selector: dict[str, str] | None = None, priority: int = 0,
         replicas: int = 1, args: tuple[str, ...] = ()) -> ModelSpec:
    g = Gpus(count=gpus, memory_bytes=int(gpu_gib * GIB), compute_capability=cc, tensor_parallel=tp)
    return ModelSpec(engine=engine, served_name="m", source=source, replicas=replicas,
                     resources=Resources(int(memory_gib * GIB), threads, g, nnodes), engine_args=args,
                     engine_version=version, pool=pool, node_selector=tuple(sorted((selector or {}).items())),
                     placement=placement, priority=priority)


def rep(rid: str, node_id: str | None, phase: Phase, model: str = "m", *, gpus: tuple[int, ...] = (),
        created_at: float = 0.0, of: ModelSpec | None = None) -> ReplicaRecord:
    """A replica; ``of`` gives it that spec's fingerprint, so a reconcile pass counts it as current."""
    return ReplicaRecord(rid, model, of.fingerprint() if of else "fp", phase, "k", node_id=node_id,
                         shard_id=f"{rid}-1" if node_id else None, gpus=gpus, created_at=created_at)


def ib_fabric(name: str, *hcas: str) -> Fabric:
    return Fabric(name, hcas)


def hca(name: str, state: str = "ACTIVE") -> Hca:
    return Hca(name, ports=(HcaPort(1, state, "LinkUp" if state == "ACTIVE" else "Disabled"),))
