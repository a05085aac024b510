"""The model file's placement parts: the resources one replica needs (GPUs, nodes) and where it may run."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from llmgw.core import units
from llmgw.core.errors import SpecError
from llmgw.core.specfields import check_fields, integer, mapping, string

PLACEMENT_POLICIES = ("spread", "binpack")
#: Facts a node measures and reports itself: a label restating one goes stale the
#: day the machine changes, so a selector on one is refused with where to say it.
MEASURED_FACTS = {"memory": "spec.resources.memory", "gpu": "spec.resources.gpus",
                  "gpus": "spec.resources.gpus", "engine": "spec.engine and spec.engine_version",
                  "engines": "spec.engine and spec.engine_version", "disk": "the node's model_dirs",
                  "pool": "spec.pool"}
LABEL_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
CAPABILITY_RE = re.compile(r"^\d+\.\d+$")
MAX_NNODES = 64

_RESOURCE_FIELDS = ("memory", "cpu_threads", "gpus", "nnodes")
_GPU_FIELDS = ("count", "memory", "compute_capability", "tensor_parallel", "pipeline_parallel")


@dataclasses.dataclass(frozen=True, slots=True)
class Gpus:
    """The GPUs one replica needs on each of its nodes. Zero or "" means "no requirement stated"."""

    count: int = 0
    #: Free memory each GPU must have, as the node reports it (other processes count too).
    memory_bytes: int = 0
    #: Minimum compute capability, "8.0"; a GPU that does not report one does not qualify.
    compute_capability: str = ""
    #: 0: not stated (the engine's default). They give count its default.
    tensor_parallel: int = 0
    pipeline_parallel: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Resources:
    """What one replica needs on its node. Zero means "no requirement stated"."""

    memory_bytes: int = 0
    cpu_threads: int = 0
    gpus: Gpus = Gpus()
    #: Nodes one replica spans (one rank per node); more than 1 needs a declared fabric.
    nnodes: int = 1


def resources_doc(r: Resources) -> dict[str, Any]:
    """The canonical ``resources`` mapping: GPU fields only when stated, so a CPU model reads as one."""
    doc: dict[str, Any] = {"memory": r.memory_bytes, "cpu_threads": r.cpu_threads}
    g = r.gpus
    if g.count:
        gdoc: dict[str, Any] = {"count": g.count, "memory": g.memory_bytes}
        if g.compute_capability:
            gdoc["compute_capability"] = g.compute_capability
        if g.tensor_parallel:
            gdoc["tensor_parallel"] = g.tensor_parallel
        if g.pipeline_parallel:
            gdoc["pipeline_parallel"] = g.pipeline_parallel
        doc["gpus"] = gdoc
    if r.nnodes != 1:
        doc["nnodes"] = r.nnodes
    return doc


def byte_count(m: Mapping[str, Any], key: str, where: str) -> int:
    """``m[key]`` as a byte count ("8Gi", "512MB", a number); 0 when it is not given."""
    if m.get(key) is None:
        return 0
    try:
        return units.parse_bytes(m[key])
    except ValueError as e:
        raise SpecError(where, str(e)) from None


def parse_resources(value: Any) -> Resources:
    res = mapping(value, "spec.resources")
    check_fields(res, _RESOURCE_FIELDS, "spec.resources")
    memory = byte_count(res, "memory", "spec.resources.memory")
    threads = 0
    if res.get("cpu_threads") is not None:
        threads = integer(res["cpu_threads"], "spec.resources.cpu_threads", lo=0, hi=4096)
    nnodes = 1
    if res.get("nnodes") is not None:
        nnodes = integer(res["nnodes"], "spec.resources.nnodes", lo=1, hi=MAX_NNODES)
    gpus = parse_gpus(res.get("gpus"), nnodes)
    if nnodes > 1 and not gpus.count:
        raise SpecError("spec.resources.nnodes", "a replica spans several nodes only with GPUs: "
                                                 "give spec.resources.gpus, or set nnodes to 1")
    return Resources(memory_bytes=memory, cpu_threads=threads, gpus=gpus, nnodes=nnodes)


def parse_gpus(value: Any, nnodes: int) -> Gpus:
    if value is None:
        return Gpus()
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"count": value}  # ``gpus: 2`` is the short form of ``gpus: {count: 2}``
    g = mapping(value, "spec.resources.gpus")
    check_fields(g, _GPU_FIELDS, "spec.resources.gpus")
    tp = integer(g.get("tensor_parallel") or 0, "spec.resources.gpus.tensor_parallel", lo=0, hi=1024)
    pp = integer(g.get("pipeline_parallel") or 0, "spec.resources.gpus.pipeline_parallel", lo=0, hi=1024)
    ranks = max(tp, 1) * max(pp, 1)
    if g.get("count") is not None:
        count = integer(g["count"], "spec.resources.gpus.count", lo=0, hi=1024)
        if (tp or pp) and count * nnodes != ranks:
            raise SpecError("spec.resources.gpus.count",
                            f"{count} GPUs on each of {nnodes} node(s) make {count * nnodes}, but "
                            f"tensor_parallel x pipeline_parallel is {ranks}; make them agree or leave count out")
    elif tp or pp:
        if ranks % nnodes:
            raise SpecError("spec.resources.gpus", f"tensor_parallel x pipeline_parallel ({ranks}) does not "
                                                   f"divide over {nnodes} nodes; give a multiple of nnodes")
        count = ranks // nnodes
    else:
        raise SpecError("spec.resources.gpus.count", "required: how many GPUs each node of a replica needs "
                                                     "(or give tensor_parallel/pipeline_parallel)")
    memory = byte_count(g, "memory", "spec.resources.gpus.memory")
    cc = g.get("compute_capability") or ""
    if isinstance(cc, float | int) and not isinstance(cc, bool):
        cc = str(cc) if "." in str(cc) else f"{cc}.0"  # YAML reads an unquoted 8.0 as a float
    if cc and (not isinstance(cc, str) or not CAPABILITY_RE.match(cc)):
        raise SpecError("spec.resources.gpus.compute_capability",
                        f"expected MAJOR.MINOR such as \"8.0\", got {cc!r}")
    if not count and (memory or cc or tp or pp):
        raise SpecError("spec.resources.gpus.count", "is 0, but other GPU requirements are given")
    return Gpus(count=count, memory_bytes=memory, compute_capability=cc, tensor_parallel=tp,
                pipeline_parallel=pp)


def parse_engine_version(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # ``engine_version: 0.11`` unquoted: YAML reads a number
    text = string(value, "spec.engine_version").strip()
    if text and not VERSION_RE.match(text):
        raise SpecError("spec.engine_version", f"{text!r} is not a version such as 0.11 or 0.11.2")
    return text


def parse_node_selector(value: Any) -> tuple[tuple[str, str], ...]:
    sel = mapping(value, "spec.node_selector")
    out: list[tuple[str, str]] = []
    for key, val in sel.items():
        field = f"spec.node_selector.{key}"
        if not isinstance(key, str) or not LABEL_RE.match(key):
            raise SpecError(field, "not a valid label name: letters, digits, '.', '_', '/', '-'")
        if key.lower() in MEASURED_FACTS:
            raise SpecError(field, f"{key} is measured on the node, not labelled; "
                                   f"say it with {MEASURED_FACTS[key.lower()]}")
        if not isinstance(val, str):
            raise SpecError(field, f"label values are strings: quote it ({key}: \"{val}\")")
        out.append((key, val))
    return tuple(sorted(out))


def parse_pool(value: Any) -> str:
    if value is None:
        return ""
    text = string(value, "spec.pool").strip()
    if text and not LABEL_RE.match(text):
        raise SpecError("spec.pool", f"{text!r} is not a valid label value")
    return text


def parallelism(resources: Resources) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of one replica over all its nodes; (1, 1) without GPUs.

    Unstated, tensor parallelism spans the GPUs of one node and pipeline
    parallelism the nodes (the fast links are inside a node); one stated
    size gives the other, and the parser has checked both against the GPUs.
    """
    g, nnodes = resources.gpus, resources.nnodes
    total = g.count * nnodes
    if not total:
        return 1, 1
    tp, pp = g.tensor_parallel, g.pipeline_parallel
    if tp and pp:
        return tp, pp
    if tp:
        return tp, max(1, total // tp)
    if pp:
        return max(1, total // pp), pp
    return g.count, nnodes
