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

from llmgw.core import engines, errors, estimate, inventory, shards, specs, units


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
    record = engines.record(profile.engine)
    found = [*_shape(profile, record), *_args(profile, record)]
    if model is not None:
        found += _model(profile, record, model)
    if node is not None:
        found += _node(profile, record, node)
        if model is not None:
            found += _memory(profile, node, model)
    return found


def _shape(p: Profile, record: engines.Engine | None) -> list[str]:
    found = []
    if record is not None and p.nnodes > 1 and not record.multi_node:
        multi = ", ".join(e.name for e in engines.ENGINES.values() if e.multi_node and e.runnable)
        found.append(f"{p.engine} runs a replica on one node only, not {p.nnodes}; set resources.nnodes to 1"
                     + (f" or use an engine that spans nodes ({multi})" if multi else ""))
    if p.gpus_per_node and p.gpus_per_node * p.nnodes != p.tensor_parallel * p.pipeline_parallel:
        total = p.gpus_per_node * p.nnodes
        found.append(f"{p.gpus_per_node} GPUs per node x {p.nnodes} node{'s' if p.nnodes != 1 else ''} is "
                     f"{total} GPUs, but tensor_parallel {p.tensor_parallel} x pipeline_parallel "
                     f"{p.pipeline_parallel} is {p.tensor_parallel * p.pipeline_parallel}; make their product "
                     f"{total} or change the GPU count")
    if not p.gpus_per_node and p.dtype == "fp8":
        found.append("dtype fp8 needs a GPU (compute capability 8.9 or later), and this replica has none; "
                     "give it GPUs or choose another dtype")
    return found


def _args(p: Profile, record: engines.Engine | None) -> list[str]:
    if record is None:
        return []
    found = []
    clashes = engines.reserved_in(p.engine, p.engine_args)
    if clashes:
        found.append(f"engine args {' '.join(clashes)} set flags llmgw sets itself for {p.engine} "
                     f"({', '.join(sorted(record.reserved_flags))}); remove them from engine_args")
    if p.context_length:
        given = [a for a in p.engine_args if a.split("=", 1)[0] in record.context_flags]
        if given:
            found.append(f"context_length {p.context_length} is set and engine args set the context too "
                         f"({' '.join(given)}); keep one, preferably context_length")
    return found


def _model(p: Profile, record: engines.Engine | None, model: inventory.WeightFile) -> list[str]:
    found = []
    tp = p.tensor_parallel
    if model.heads > 0 and model.heads % tp:
        found.append(f"tensor_parallel {tp} does not divide {model.heads} attention heads; use "
                     f"{_words(_divisors(model.heads))}")
    # vLLM's QKVParallelLinear (vllm 0.32, model_executor/layers/linear.py, the branch on
    # ``tp_size >= self.total_num_kv_heads``) splits the KV heads when tp <= kv_heads and
    # replicates each one tp / kv_heads times when tp > kv_heads, with ``divide()`` asserting
    # the division is exact either way; SGLang's QKVParallelLinear has the same two branches.
    # So 8 KV heads run at tp 2, 4, 8 or 16, and only a size neither side divides is refused.
    kv = model.kv_heads
    if kv > 0 and kv % tp and tp % kv:
        fits = [d for d in _divisors(model.heads or kv) if kv % d == 0 or d % kv == 0]
        found.append(f"tensor_parallel {tp} neither divides the model's {kv} KV heads nor is a multiple of "
                     f"them; use {_words(fits)}")
    if p.context_length and model.context_length and p.context_length > model.context_length:
        found.append(f"context_length {p.context_length} is longer than the model's {model.context_length} "
                     "(max_position_embeddings); lower context_length to at most that")
    if (record is not None and record.cpu_head_dim_min and not p.gpus_per_node
            and 0 < model.head_dim < record.cpu_head_dim_min):
        found.append(f"{p.engine} on a CPU needs attention heads of at least {record.cpu_head_dim_min} "
                     f"elements, and this model's have {model.head_dim}; give the replica a GPU or serve it "
                     "with llamacpp")
    return found


def _node(p: Profile, record: engines.Engine | None, node: NodeFacts) -> list[str]:
    found = []
    need = DTYPE_CAPABILITY.get(p.dtype)
    if need is not None and p.gpus_per_node:
        old = [g for g in _gpus_of(p, node) if (cc := _capability(g.compute_capability)) and cc < need]
        if old:
            names = ", ".join(f"GPU {g.index} ({g.name}, {g.compute_capability})" for g in old)
            found.append(f"dtype {p.dtype} needs compute capability {need[0]}.{need[1]} or later, and {names} "
                         f"{'has' if len(old) == 1 else 'have'} less; choose another dtype (float16 runs on every GPU) "
                         "or GPUs that have it")
    if (record is not None and record.cpu_flags_any and not p.gpus_per_node and node.cpu_flags
            and not set(record.cpu_flags_any) & set(node.cpu_flags)):
        found.append(f"{p.engine} on a CPU needs one of the CPU features {', '.join(record.cpu_flags_any)}, and "
                     "this node's CPU has none; give the replica a GPU, pick a node whose CPU has one, or "
                     "serve it with llamacpp")
    if node.engines:
        versions = sorted(v for name, v in node.engines if name == p.engine)
        installed = ", ".join(sorted({name for name, _ in node.engines}))
        if not versions:
            found.append(f"the node has no {p.engine} installed (it has {installed}); install it there or "
                         "choose another engine")
        elif p.engine_version and not any(engines.version_matches(v, p.engine_version) for v in versions):
            found.append(f"the node has {p.engine} {', '.join(versions)}, not {p.engine_version}; install "
                         f"{p.engine} {p.engine_version} there or change engine_version")
    return found


def _memory(p: Profile, node: NodeFacts, model: inventory.WeightFile) -> list[str]:
    gpus = _gpus_of(p, node)
    if not p.gpus_per_node or len(gpus) < p.gpus_per_node or any(g.memory_total_bytes <= 0 for g in gpus):
        return []
    ctx = p.context_length or engines.context_tokens(p.engine, p.engine_args)
    # Each GPU holds 1/(tp x pp) of the weights and of the KV cache (its layers' heads), as placement
    # estimates it: sized at tp alone, the agent would refuse what placement accepted at pp > 1.
    need = estimate.memory_bytes(model, ctx, tensor_parallel=p.tensor_parallel * p.pipeline_parallel, gpu=True)
    if need is None:
        return []
    # At placement any of the node's GPUs may be chosen: the ones with the most free memory.
    chosen = gpus if p.gpu_indices else sorted(gpus, key=_free, reverse=True)[:p.gpus_per_node]
    short = [g for g in chosen if _free(g) < need]
    if not short:
        return []
    free = ", ".join(f"GPU {g.index} has {units.format_bytes(_free(g))}" for g in short)
    return [f"each GPU needs about {units.format_bytes(need)} for the weights and a KV cache of "
            f"{ctx or model.context_length} tokens at tensor_parallel {p.tensor_parallel}, and {free} free; "
            "raise tensor_parallel, lower context_length, or free the GPUs"]


#: The compute capability each dtype needs: bfloat16 from Ampere (8.0), fp8 from Ada (8.9).
DTYPE_CAPABILITY = {"bfloat16": (8, 0), "fp8": (8, 9)}


def _gpus_of(p: Profile, node: NodeFacts) -> list[inventory.Gpu]:
    """The GPUs given (agent side), else all the node's (at placement)."""
    if p.gpu_indices:
        return [g for g in node.gpus if g.index in p.gpu_indices]
    return list(node.gpus)


def _free(gpu: inventory.Gpu) -> int:
    return max(0, gpu.memory_total_bytes - gpu.memory_used_bytes)


def _capability(text: str) -> tuple[int, int] | None:
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _words(values: list[int]) -> str:
    """"1, 2, 4 or 8"."""
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} or {text[-1]}"


def validate(profile: Profile, node: NodeFacts | None = None, model: inventory.WeightFile | None = None) -> None:
    """EngineError naming every problem ``problems`` finds; returns when there is none."""
    found = problems(profile, node, model)
    if found:
        raise errors.EngineError("; ".join(found))
