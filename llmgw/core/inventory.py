"""What a node is and has, as its agent measured it.

Plain frozen values, so they compare, hash into fingerprints and cross the
wire through ``llmgw.api.convert`` without carrying protobuf around.
"""

from __future__ import annotations

import dataclasses

from llmgw.core.provision import EngineInstall, InstallState


@dataclasses.dataclass(frozen=True, slots=True)
class Disk:
    path: str
    total_bytes: int
    free_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU, as the driver lists it."""

    #: As the driver lists it to the agent: the numbering ShardStatus.pid uses when
    #: the agent and its engines share a pid namespace, as they do when it starts them.
    pid: int
    #: 0 when the driver does not say (some containers, MIG).
    used_memory_bytes: int
    #: The executable's short name ("python3"); "" when the agent cannot see the pid.
    name: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: str = ""
    #: Indices of the GPUs this one reaches over NVLink.
    nvlink_peers: tuple[int, ...] = ()
    pci_bus_id: str = ""
    #: Every process holding memory on it, so that a GPU another job fills can be
    #: named by pid in a placement refusal; () where the driver lists none.
    processes: tuple[GpuProcess, ...] = ()
    #: Percent of the last sample period the GPU was busy (0..100); None where the
    #: driver does not measure it or an older agent does not send it.
    utilization_percent: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class HostFacts:
    os_id: str = ""
    os_version: str = ""
    os_codename: str = ""
    arch: str = ""
    kernel: str = ""
    cpu_flags: tuple[str, ...] = ()
    nvidia_driver: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class HcaPort:
    port: int
    #: "ACTIVE", "DOWN", "INIT", ... without sysfs's leading number.
    state: str
    phys_state: str = ""
    rate_gbps: float = 0.0
    #: "InfiniBand", or "Ethernet" for RoCE.
    link_layer: str = ""
    port_guid: str = ""
    gid_prefix: str = ""
    #: GID table index of the RoCE v2 IPv4 GID; -1 when there is none.
    roce_v2_gid_index: int = -1
    counters: tuple[tuple[str, int], ...] = ()
    netdev: str = ""

    @property
    def usable(self) -> bool:
        """Carries traffic now: ACTIVE and physically LinkUp."""
        return self.state == "ACTIVE" and self.phys_state in ("", "LinkUp")


@dataclasses.dataclass(frozen=True, slots=True)
class Hca:
    name: str
    node_guid: str = ""
    ports: tuple[HcaPort, ...] = ()

    @property
    def usable(self) -> bool:
        return any(p.usable for p in self.ports)


@dataclasses.dataclass(frozen=True, slots=True)
class Fabric:
    """A declared fabric and the adapters of it that are usable now."""

    name: str
    hcas: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class SubnetManager:
    lid: int
    guid: str = ""
    priority: int = 0
    state: str = ""
    via: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ModelDir:
    path: str
    total_bytes: int
    free_bytes: int
    #: On a shared filesystem (NFS, Lustre, CephFS, GPFS, BeeGFS, ...).
    shared: bool = False
    fs_type: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class WeightFile:
    #: A .gguf file, or a directory of safetensors files with a config.json.
    path: str
    size_bytes: int
    #: "gguf" or "safetensors".
    format: str
    # What a memory estimate (``llmgw.core.estimate``) needs, read from the GGUF
    # header or config.json. 0 means unknown: a field the file does not state,
    # or a file that could not be read, which is never a reason to hide it.
    #: Parameter count (GGUF: summed from the tensor shapes).
    params: int = 0
    #: Transformer blocks.
    layers: int = 0
    #: Attention (query) heads.
    heads: int = 0
    #: Key/value heads: fewer than ``heads`` with grouped-query attention.
    kv_heads: int = 0
    #: Elements per head of a key or value.
    head_dim: int = 0
    #: Width of the residual stream (GGUF's embedding_length).
    hidden_size: int = 0
    #: The context the model was trained for; an engine's default when none is given.
    context_length: int = 0
    #: Bytes per element of the declared dtype (2 for bfloat16/float16, 4 for float32);
    #: 0 for a quantized GGUF, whose size is the file's.
    dtype_bytes: int = 0
    #: Fetched by llmgw into its weights cache: the only weights RemoveWeights may remove.
    fetched_by_llmgw: bool = False
    #: The source it was fetched from; "" for weights found on disk.
    source: str = ""
    #: When a shard last used it (unix seconds); 0: never, or not fetched by llmgw.
    last_used_unix: int = 0
    #: Its name in the weights cache, what RemoveWeights names; "" when not fetched by llmgw.
    cache_name: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class NvlinkFabric:
    state: str = ""
    clique_id: str = ""
    cluster_uuid: str = ""
    imex_state: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    """A node's hardware, what it holds and the engines it can run."""

    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    disks: tuple[Disk, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    os: str = ""
    arch: str = ""
    engines: tuple[tuple[str, str], ...] = ()  # (name, version)
    host: HostFacts = HostFacts()
    hcas: tuple[Hca, ...] = ()
    fabrics: tuple[Fabric, ...] = ()
    model_dirs: tuple[ModelDir, ...] = ()
    weights: tuple[WeightFile, ...] = ()
    nvlink: NvlinkFabric = NvlinkFabric()
    subnet_managers: tuple[SubnetManager, ...] = ()
    mgmt_interface: str = ""
    #: Engines llmgw installed here (or is installing), each with its state (``core.provision``).
    installs: tuple[EngineInstall, ...] = ()

    def engine_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.engines)


@dataclasses.dataclass(frozen=True, slots=True)
class ShardLoad:
    shard_id: str
    cpu_cores: float
    rss_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    """One heartbeat. ``None`` for a changing part means "unchanged since the last message"."""

    memory_total_bytes: int
    memory_available_bytes: int
    cpu_percent: float = 0.0
    load1: float = 0.0
    load5: float = 0.0
    load15: float = 0.0
    gpus: tuple[Gpu, ...] = ()
    disks: tuple[Disk, ...] = ()
    shard_load: tuple[ShardLoad, ...] = ()
    hcas: tuple[Hca, ...] = ()
    weights: tuple[WeightFile, ...] | None = None
    fabrics: tuple[Fabric, ...] | None = None
    engines: tuple[tuple[str, str], ...] | None = None
    model_dirs: tuple[ModelDir, ...] | None = None
    nvlink: NvlinkFabric | None = None
    subnet_managers: tuple[SubnetManager, ...] | None = None
    installs: tuple[EngineInstall, ...] | None = None


def _tuple(items: object, build: type) -> tuple:  # type: ignore[type-arg]
    return tuple(build(**x) for x in (items or ()))  # type: ignore[attr-defined]


def inventory_from_dict(doc: dict) -> Inventory:  # type: ignore[type-arg]
    """The inverse of ``dataclasses.asdict(inventory)``, tolerant of fields an older version did not write."""
    hcas = tuple(Hca(name=h["name"], node_guid=h.get("node_guid", ""),
                     ports=tuple(HcaPort(**{**p, "counters": tuple(tuple(c) for c in p.get("counters", ()))})
                                 for p in h.get("ports", ())))
                 for h in doc.get("hcas", ()))
    gpus = tuple(Gpu(**{**g, "nvlink_peers": tuple(g.get("nvlink_peers", ())),
                        "processes": _tuple(g.get("processes"), GpuProcess)}) for g in doc.get("gpus", ()))
    host = doc.get("host") or {}
    return Inventory(
        cpu_count=doc.get("cpu_count", 0), memory_total_bytes=doc.get("memory_total_bytes", 0),
        memory_available_bytes=doc.get("memory_available_bytes", 0), disks=_tuple(doc.get("disks"), Disk),
        gpus=gpus, os=doc.get("os", ""), arch=doc.get("arch", ""),
        engines=tuple((n, v) for n, v in doc.get("engines", ())),
        host=HostFacts(**{**host, "cpu_flags": tuple(host.get("cpu_flags", ()))}), hcas=hcas,
        fabrics=tuple(Fabric(f["name"], tuple(f.get("hcas", ()))) for f in doc.get("fabrics", ())),
        model_dirs=_tuple(doc.get("model_dirs"), ModelDir), weights=_tuple(doc.get("weights"), WeightFile),
        nvlink=NvlinkFabric(**(doc.get("nvlink") or {})),
        subnet_managers=_tuple(doc.get("subnet_managers"), SubnetManager),
        mgmt_interface=doc.get("mgmt_interface", ""),
        installs=tuple(EngineInstall(**{**x, "state": InstallState(x["state"]),
                                        "last_output": tuple(x.get("last_output", ())),
                                        "missing_os_packages": tuple(x.get("missing_os_packages", ()))})
                       for x in doc.get("installs", ())),
    )
