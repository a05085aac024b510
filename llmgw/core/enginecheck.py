"""Would this profile run? Refused before launch, with what to change (pure).

An engine refuses a bad profile only after it has started, and a big model
only after minutes of loading, on a node nobody watches. These checks run
twice: by the control plane at placement (with the node's reported facts and
the weights' metadata its inventory carries), and by the agent before it
starts anything (with its own facts). Each problem is one sentence that says
what to change ("tensor_parallel 3 does not divide 32 attention heads; use 1,
2, 4, 8, 16 or 32").

``problems`` answers every problem found (empty: it would run); a check whose
facts are missing (no node, no model metadata, a GPU that does not report its
compute capability) is skipped, never guessed.
"""

from __future__ import annotations

import dataclasses

from llmgw.core import errors, inventory, shards, specs


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a node says about itself that decides whether an engine runs there."""

    #: The node's GPUs (index, memory, compute capability, ...).
    gpus: tuple[inventory.Gpu, ...] = ()
    #: (name, version) of each engine installed there.
    engines: tuple[tuple[str, str], ...] = ()
    #: The interface of its management address ("eth0"): NCCL's and Gloo's bootstrap go over it.
    mgmt_interface: str = ""
    #: Its InfiniBand / RoCE adapters, for NCCL_IB_HCA and the RoCE v2 GID index.
    hcas: tuple[inventory.Hca, ...] = ()
    #: The CPU's flags ("avx512f", "amx_bf16", ...), for engines whose CPU kernels need some.
    cpu_flags: tuple[str, ...] = ()

    @classmethod
    def of(cls, inv: inventory.Inventory) -> NodeFacts:
        return cls(gpus=inv.gpus, engines=inv.engines, mgmt_interface=inv.mgmt_interface, hcas=inv.hcas,
                   cpu_flags=inv.host.cpu_flags)


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """One replica's engine settings, as a model file gives them or as one shard carries them."""

    engine: str
    engine_version: str = ""
    #: GPUs on each node of the replica (0: a CPU replica).
    gpus_per_node: int = 0
    #: Which of the node's GPUs (agent side); () at placement, where any may be chosen.
    gpu_indices: tuple[int, ...] = ()
    nnodes: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    dtype: str = ""
    context_length: int = 0
    engine_args: tuple[str, ...] = ()
    #: Memory placement gave on each GPU (0: not stated nor estimated).
    gpu_memory_bytes: int = 0

    @classmethod
    def of_shard(cls, spec: shards.ShardSpec, *, engine_version: str = "") -> Profile:
        return cls(engine=spec.engine, engine_version=engine_version, gpus_per_node=len(spec.gpus),
                   gpu_indices=spec.gpus, nnodes=spec.nnodes, tensor_parallel=spec.tensor_parallel,
                   pipeline_parallel=spec.pipeline_parallel, dtype=spec.dtype, context_length=spec.context_length,
                   engine_args=spec.args, gpu_memory_bytes=spec.gpu_memory_bytes)

    @classmethod
    def of_model(cls, spec: specs.ModelSpec) -> Profile:
        tp, pp = specs.parallelism(spec.resources)
        return cls(engine=spec.engine, engine_version=spec.engine_version, gpus_per_node=spec.resources.gpus.count,
                   nnodes=spec.resources.nnodes, tensor_parallel=tp, pipeline_parallel=pp, dtype=spec.dtype,
                   context_length=spec.context_length, engine_args=spec.engine_args,
                   gpu_memory_bytes=spec.resources.gpus.memory_bytes)


def problems(profile: Profile, node: NodeFacts | None = None,
             model: inventory.WeightFile | None = None) -> list[str]:
    """Every reason ``profile`` would not run on ``node`` with ``model``'s weights; [] when none is found."""
    raise NotImplementedError  # filled in by the adapters' work


def validate(profile: Profile, node: NodeFacts | None = None, model: inventory.WeightFile | None = None) -> None:
    """EngineError naming every problem ``problems`` finds; returns when there is none."""
    found = problems(profile, node, model)
    if found:
        raise errors.EngineError("; ".join(found))
