"""What one replica of a model needs from a node, worked out once per model and pass.

The hot loop of a pass compares nodes against this value, not against the
spec: reading ``spec.resources.gpus.compute_capability`` and parsing it for
each of 10,000 nodes was a measurable share of a pass.
"""

from __future__ import annotations

import dataclasses

from llmgw.core import enginecheck, engines, sources
from llmgw.core.inventory import WeightFile
from llmgw.core.specs import ModelSpec

#: Sources read remotely; every other one is a local path or a package.
REMOTE_PREFIXES = ("hf://", "http://", "https://", "mirror://")


def is_remote(source: str) -> bool:
    return source.startswith(REMOTE_PREFIXES)


def fetched_source(spec: ModelSpec) -> sources.Source | None:
    """What a node fetches for ``spec`` (its source with ``source_file`` folded in), or None for a local one.

    Its text is what fetched weights report as their source and what a FETCHING shard is matched
    by; its cache name what RemoveWeights names. None also for a source that does not parse (a
    model stored by an older version): it is then never matched, never guessed at.
    """
    if not is_remote(spec.source):
        return None
    try:
        src = sources.parse(spec.source)
        return sources.with_file(src, spec.source_file) if spec.source_file else src
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteWeights:
    """What the control plane read of a remote source's metadata (``llmgw.control.remotemeta``), by (source, file).

    A pass only reads these: the reads happen off the loop, before it, so a
    slow or unreachable hub never slows placement.
    """

    #: The weights as they will be once fetched (size = the files the engine needs); None when unreadable.
    weight: WeightFile | None = None
    #: Why it could not be read ("GET https://mirror/api/models/org/x/revision/main: 404"); "" when read.
    problem: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Need:
    model: str
    engine: str
    engine_version: str = ""
    selector: tuple[tuple[str, str], ...] = ()
    pool: str = ""
    policy: str = "spread"
    threads: int = 0
    #: Host memory.
    memory_bytes: int = 0
    gpu_count: int = 0
    #: Free memory each GPU must have (0: the GPU must be nearly idle, see ``gpus``).
    gpu_memory_bytes: int = 0
    compute_capability: tuple[int, int] | None = None
    #: What a node reports for "weights present": the path of a file:// source, the source text of a
    #: remote one (fetched weights carry their source; a FETCHING shard its spec's); "" otherwise.
    weights_path: str = ""
    #: Disk the weights take on a node that holds none of them yet (remote sources whose size was read); 0: no check.
    disk_bytes: int = 0
    #: True when the memory above was estimated from the weights, not stated.
    memory_estimated: bool = False
    nnodes: int = 1
    #: The dtype the engine runs in when it raised ``compute_capability`` above what the spec
    #: states ("bfloat16"), so that a refusal says why an older GPU does not qualify; else "".
    capability_for: str = ""
    #: CPU flags one of which the engine needs to run without a GPU (SGLang: AVX-512 or AMX);
    #: () for a GPU replica, or an engine that runs on any CPU.
    cpu_flags_any: tuple[str, ...] = ()

    @property
    def static_key(self) -> tuple[object, ...]:
        """What decides, without looking at free resources, whether a node can ever take it."""
        return (self.engine, self.engine_version, self.cpu_flags_any, self.selector, self.pool)

    @property
    def placed_memory(self) -> int:
        """The memory recorded on the replica: per GPU for a GPU replica, host memory otherwise."""
        return self.gpu_memory_bytes if self.gpu_count else self.memory_bytes


def parse_capability(text: str) -> tuple[int, int] | None:
    """``"8.0"`` -> (8, 0); None for "" or anything else (a GPU that does not say)."""
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)


def dtype_capability(dtype: str) -> tuple[int, int] | None:
    """The compute capability a GPU needs to run ``dtype`` (bfloat16: (8, 0)); None when any GPU does.

    The table is the engine check's (``llmgw.core.enginecheck``), read here so that
    placement and the agent's check before launch never disagree on a GPU.
    """
    return enginecheck.DTYPE_CAPABILITY.get(dtype)


def weights_path(source: str) -> str:
    """The key nodes' weights are matched by: a file:// source's path, a remote source's text, else ""."""
    if is_remote(source):
        return source
    # A safetensors directory may be written with a trailing slash on either side.
    return source[len("file://"):].rstrip("/") if source.startswith("file://") else ""


def weights_key(spec: ModelSpec) -> str:
    """``weights_path`` of what a node holds for ``spec``: a remote source's key is what the node fetches."""
    fetched = fetched_source(spec)
    return fetched.text if fetched is not None else weights_path(spec.source)


def context_tokens(engine: str, args: tuple[str, ...]) -> int:
    """The context the engine is told to hold (``--ctx-size N`` or ``--ctx-size=N``), else its default.

    The engine record's reading (``llmgw.core.engines.context_tokens``), the one the engine
    check sizes its memory check with: placement's estimate must not size another context.
    0 asks the estimate to take the model's own context.
    """
    return engines.context_tokens(engine, args)


def need_for(model: str, spec: ModelSpec, *, estimate: int | None = None, disk_bytes: int = 0) -> Need:
    """The need of one replica of ``spec``; ``estimate`` is the memory estimated from its weights, if any.

    An estimate is used only where the spec states no memory: it is per GPU
    (one rank) for a GPU model, host memory otherwise.
    """
    res = spec.resources
    g = res.gpus
    memory, gpu_memory, estimated = res.memory_bytes, g.memory_bytes, False
    if estimate:
        if g.count and not gpu_memory:
            gpu_memory, estimated = estimate, True
        elif not g.count and not memory:
            memory, estimated = estimate, True
    # A dtype older GPUs cannot run (bfloat16 before 8.0) raises the capability a GPU must have:
    # the GPU filter then skips them as it does for a stated capability, at no cost per node,
    # where the engine would otherwise load for minutes and then fail on each of them.
    capability, capability_for = parse_capability(g.compute_capability), ""
    floor = dtype_capability(spec.dtype) if g.count else None
    if floor is not None and (capability is None or floor > capability):
        capability, capability_for = floor, spec.dtype
    record = engines.record(spec.engine)
    cpu_flags = record.cpu_flags_any if record is not None and not g.count else ()
    return Need(model=model, engine=spec.engine, engine_version=spec.engine_version,
                selector=spec.node_selector, pool=spec.pool, policy=spec.placement, threads=res.cpu_threads,
                memory_bytes=memory, gpu_count=g.count, gpu_memory_bytes=gpu_memory,
                compute_capability=capability, weights_path=weights_key(spec),
                memory_estimated=estimated, nnodes=res.nnodes, capability_for=capability_for,
                cpu_flags_any=cpu_flags, disk_bytes=disk_bytes)
