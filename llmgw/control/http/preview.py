"""``/api/v1/catalog`` and ``/api/v1/preview``: the models to start from, and what deploying one would do.

``POST /api/v1/preview`` takes either a source (a Hugging Face repository id, ``hf://``, ``mirror://`` or a path a
node reports) with the engine, context and concurrency to size it for, or a whole model file (``manifest``:
what ``llmgw apply --dry-run`` sends). It answers the weights' metadata, the memory each engine that can run
them needs, the model file it would apply, and the placer's dry run: the nodes it lands on and every other
node's reason. Nothing is applied, stored or sent to a node. An operator's call (it makes the control plane
read from the hub); the reads are ``remotemeta``'s, under its network guard; a path is never opened
(``control.catalog.facts``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import yaml
from fastapi import APIRouter, Request

from llmgw.control import remotemeta
from llmgw.control.catalog import dryrun, entries, facts
from llmgw.control.http import schemas
from llmgw.control.http import settings as settings_http
from llmgw.control.http.apierrors import Unprocessable, read_json
from llmgw.control.placement.needs import fetched_source
from llmgw.control.state import NodeView
from llmgw.control.store.offloop import StoreThread
from llmgw.core import enginecheck, modelfacts, specpolicy, specs
from llmgw.core.errors import SpecError

MAX_BODY = 1 << 20
#: Bounds of what a preview sizes for: past them no engine holds the cache anyway.
MAX_CONTEXT, MAX_CONCURRENCY, MAX_REPLICAS = 10_000_000, 4096, 1000
#: Previews reading metadata at once; more wait their turn (each read may take a GGUF header's Range
#: requests, up to 64 MiB, and a worker thread): a loop of previews cannot flood the hub or the threads.
MAX_READS = 4
_ASKED = ("source", "engine", "context", "concurrency", "replicas", "name", "manifest")


class _Cluster(Protocol):
    nodes: dict[str, NodeView]
    remote_meta: remotemeta.Reader | None


class CatalogEntry(schemas.Body):
    name: str
    source: str
    size: str
    license: str
    engine: str
    description: str


class Catalog(schemas.Body):
    items: list[CatalogEntry]


class Metadata(schemas.Body):
    source: str
    origin: str
    format: str
    architecture: str
    dtype: str
    quantization: str
    params: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    context_length: int
    size_bytes: int
    files: dict[str, int]


class EngineMemoryDoc(schemas.Body):
    engine: str
    device: str
    weights_bytes: int
    kv_bytes: int
    total_bytes: int


class NodeAnswerDoc(schemas.Body):
    node: str
    replicas: int
    gpus: list[int]
    reason: str
    fits: bool


class PlacementDoc(schemas.Body):
    placed: int
    wanted: int
    message: str
    memory_bytes: int
    memory_estimated: bool
    nodes: list[NodeAnswerDoc]


class PreviewDoc(schemas.Body):
    """A deploy preview: nothing here was applied."""

    name: str
    engine: str
    context: int
    concurrency: int
    metadata: Metadata | None
    metadata_problem: str
    memory: list[EngineMemoryDoc]
    engines: list[str]
    manifest: dict[str, Any]
    manifest_yaml: str
    placement: PlacementDoc


def _whole(doc: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise Unprocessable(f"{key}: expected a whole number from {lo} to {hi}, got {value!r}", code="invalid_preview",
                            param=key)
    return value


def _text(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 2048:
        raise Unprocessable(f"{key}: expected a string of at most 2048 characters", code="invalid_preview", param=key)
    return value.strip()


def _metadata_doc(f: facts.Facts) -> dict[str, Any]:
    w = f.weight
    return {"source": f.source, "origin": f.origin, "format": w.format, "architecture": f.labels.architecture,
            "dtype": f.labels.dtype or {4: "float32", 2: "16-bit", 1: "8-bit"}.get(w.dtype_bytes, ""),
            "quantization": f.labels.quantization, "params": w.params, "layers": w.layers,
            "hidden_size": w.hidden_size, "heads": w.heads, "kv_heads": w.kv_heads, "head_dim": w.head_dim,
            "context_length": w.context_length, "size_bytes": w.size_bytes, "files": dict(sorted(f.files.items()))}


def _manifest_from_source(doc: dict[str, Any], found: facts.Facts) -> tuple[dict[str, Any], str, int, int]:
    """The model file a source preview would apply, with the engine, context and concurrency it sized."""
    context = _whole(doc, "context", 0, 0, MAX_CONTEXT)
    concurrency = _whole(doc, "concurrency", 1, 1, MAX_CONCURRENCY)
    replicas = _whole(doc, "replicas", 1, 0, MAX_REPLICAS)
    runnable = modelfacts.engines_for(found.weight.format)
    engine = _text(doc, "engine") or runnable[0]
    if engine not in runnable:
        raise Unprocessable(f"engine: {engine} cannot load {found.weight.format or 'these'} weights; one of "
                            f"{', '.join(runnable)} can", code="invalid_preview", param="engine")
    name = _text(doc, "name") or modelfacts.model_name(found.source)
    memory = modelfacts.memory_for(found.weight, engine, context=context, concurrency=concurrency)
    manifest = modelfacts.manifest(name, source=found.source, source_file="", engine=engine, context=context,
                                   concurrency=concurrency, memory_bytes=memory.total_bytes, replicas=replicas)
    return manifest, engine, context, concurrency


async def _checked(db: StoreThread, manifest: Any) -> specs.Model:
    """The model file as apply checks it (spec, the cluster's policy, what every engine refuses)."""
    try:
        model = specs.parse_manifest(manifest)
        policy = await settings_http.current(db)
        specpolicy.check(model.spec, allowed_env=policy.allowed_env, allow_remote_code=policy.allow_remote_code)
    except SpecError as e:
        raise Unprocessable(str(e), code="invalid_spec", param=e.field) from None
    found = enginecheck.problems(enginecheck.Profile.of_model(model.spec))
    if found:
        raise Unprocessable(f"{model.spec.engine} would refuse this model on any node: {'; '.join(found)}",
                            code="engine_refused", param="spec")
    return model


def router(db: StoreThread, cluster: _Cluster, catalog: tuple[entries.Entry, ...]) -> APIRouter:
    api = APIRouter()
    reads = asyncio.Semaphore(MAX_READS)

    async def read(source: str, nodes: list[NodeView]) -> facts.Facts:
        async with reads:
            return await asyncio.to_thread(facts.read, source, reader=cluster.remote_meta, nodes=nodes)

    @api.get("/api/v1/catalog", response_model=Catalog)
    async def list_catalog() -> dict[str, Any]:
        """The catalog of models to start a deployment from (the shipped one, or ``llmgw server --catalog``'s)."""
        return {"items": [{"name": e.name, "source": e.source, "size": e.size, "license": e.license,
                           "engine": e.engine, "description": e.description} for e in catalog]}

    @api.post("/api/v1/preview", response_model=PreviewDoc)
    async def preview(request: Request) -> dict[str, Any]:
        """A dry run of deploying a source or a model file: metadata, memory per engine, placement; nothing applied."""
        doc = read_json(await request.body(), limit=MAX_BODY)
        if not isinstance(doc, dict) or bool(doc.get("source")) == bool(doc.get("manifest")):
            raise Unprocessable("give either source (ORG/REPO, hf://…, mirror://… or a path a node reports) or "
                                "manifest (a model file as JSON), not both", code="invalid_preview", param="source")
        unknown = sorted(set(doc) - set(_ASKED))
        if unknown:
            raise Unprocessable(f"{unknown[0]}: not a preview field; one of {', '.join(_ASKED)}",
                                code="invalid_preview", param=unknown[0])
        nodes = list(cluster.nodes.values())
        found: facts.Facts | None = None
        problem = ""
        if doc.get("source"):
            try:
                found = await read(_text(doc, "source"), nodes)
            except facts.Unusable as e:
                raise Unprocessable(str(e), code="unreadable_source", param="source") from None
            manifest, engine, context, concurrency = _manifest_from_source(doc, found)
            model = await _checked(db, manifest)
        else:
            model = await _checked(db, doc["manifest"])
            manifest = model.to_manifest()
            engine, context, concurrency = model.spec.engine, model.spec.context_length, 1
            fetched = fetched_source(model.spec)
            source = fetched.text if fetched is not None else model.spec.source
            if source and not source.startswith("pkg:"):
                try:
                    found = await read(source, nodes)
                except facts.Unusable as e:
                    problem = str(e).removeprefix("source: ")
        stored = await db.list_models()
        models = {m.model.name: m.model.spec for m in stored}
        replicas = await db.list_replicas()
        remote = facts.remote_of(found) if found is not None else None
        placed = await asyncio.to_thread(dryrun.preview, model.name, model.spec, nodes, replicas, models, remote)
        memory = [modelfacts.memory_for(found.weight, e, context=context, concurrency=concurrency)
                  for e in modelfacts.engines_for(found.weight.format)] if found is not None else []
        return {"name": model.name, "engine": engine, "context": context, "concurrency": concurrency,
                "metadata": _metadata_doc(found) if found is not None else None, "metadata_problem": problem,
                "memory": [vars_of(m) for m in memory],
                "engines": list(modelfacts.engines_for(found.weight.format)) if found is not None else [],
                "manifest": manifest, "manifest_yaml": yaml.safe_dump(manifest, sort_keys=False),
                "placement": placed.doc()}

    return api


def vars_of(m: modelfacts.EngineMemory) -> dict[str, Any]:
    return {"engine": m.engine, "device": m.device, "weights_bytes": m.weights_bytes, "kv_bytes": m.kv_bytes,
            "total_bytes": m.total_bytes}
