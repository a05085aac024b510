"""``/api/v1/models``: models applied, read, scaled by hand, described and deleted.

Bodies are model manifests as JSON (the CLI turns YAML into this). A manifest is refused before it is
stored when it breaks the spec's rules, the cluster's spec policy (``settings``), or what every engine
would refuse of it on any node (``core.enginecheck``); each refusal names the field.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response

from llmgw.control import events as ev
from llmgw.control.cluster import Cluster
from llmgw.control.http import modeldocs, schemas
from llmgw.control.http import settings as settings_http
from llmgw.control.http.apierrors import BadRequest, Conflict, NotFound, Unprocessable, read_json
from llmgw.control.state import ReplicaRecord
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import StoredModel
from llmgw.core import adapterkind, adapters, enginecheck, specpolicy, specs
from llmgw.core.errors import SpecError

MAX_BODY = 1 << 20
T = TypeVar("T")
_HINT = "`llmgw get models` lists them"


async def read_body(request: Request, parse: Callable[[Any], T]) -> T:
    """The request's JSON body read by ``parse``; its SpecError a 422 naming the field."""
    doc = read_json(await request.body(), limit=MAX_BODY)
    try:
        return parse(doc)
    except SpecError as e:
        raise Unprocessable(str(e), code="invalid_spec", param=e.field) from None


async def read_manifest(db: StoreThread, request: Request) -> specs.Model:
    """The request's model file, with the adapters applied on their own beside the stored one kept
    (``adapterkind.carry``), checked against the spec, the cluster's policy and what any engine refuses."""
    model = await read_body(request, specs.parse_manifest)
    before = await db.get_model(model.name)
    model = adapterkind.carry(before.model if before else None, model)
    await check_model(db, model)
    return model


async def check_model(db: StoreThread, model: specs.Model, *, field_of: Callable[[str], str] = str) -> None:
    """422 naming the field when ``model`` breaks the spec, the cluster's policy, another model's names or what
    every engine would refuse; ``field_of`` renames a field for the document the caller was given."""
    try:
        specs.parse_manifest(model.to_manifest())  # a model joined with adapters is checked as one file would be
        # The cluster's env allowlist and code flags (issue 24), with the admin's settings in force.
        policy = await settings_http.current(db)
        specpolicy.check(model.spec, allowed_env=policy.allowed_env, allow_remote_code=policy.allow_remote_code)
        others = [(o.model.name, o.model.spec.served_name, o.model.spec.aliases, o.model.spec.adapters)
                  for o in await db.list_models()]
        s = model.spec
        adapters.check_unique(model.name, s.served_name, s.aliases, s.adapters, others)
    except SpecError as e:
        raise Unprocessable(str(e), code="invalid_spec", param=field_of(e.field)) from None
    # What the model file alone proves the engine would refuse (fp8 without a GPU, a reserved
    # flag spelt with underscores) is refused here. Checks that need the weights' metadata or
    # a node's facts run at placement, where the answer is the model's Placed condition
    # (EngineRefused): the weights a node reports can change without the model file changing.
    found = enginecheck.problems(enginecheck.Profile.of_model(model.spec))
    if found:
        raise Unprocessable(f"{model.spec.engine} would refuse this model on any node: {'; '.join(found)}",
                            code="engine_refused", param="spec")


def _replica_count(doc: object) -> int:
    """``{"replicas": N}``'s N, a whole number >= 0, or the refusal naming it."""
    replicas = doc.get("replicas") if isinstance(doc, dict) else None
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise Unprocessable(f"replicas: expected a whole number >= 0, got {replicas!r}", code="invalid_spec",
                            param="replicas")
    return replicas


async def _stored(db: StoreThread, name: str) -> StoredModel:
    stored = await db.get_model(name)
    if stored is None:
        raise NotFound("model", name, _HINT)
    return stored


async def _replicas_of(db: StoreThread, name: str) -> list[ReplicaRecord]:
    return [r for r in await db.list_replicas() if r.model == name]


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    """Reading models here; changing them in ``_changes``."""
    api = APIRouter()

    @api.get("/api/v1/models", response_model=schemas.ModelList, response_model_exclude_unset=True)
    async def list_models() -> dict[str, Any]:
        # The light records (``Store.list_replica_states``): Ready ones counted by the database, the others'
        # seven fields a status reads; whole replicas were 0.19 s of this call with 2,000 of them.
        replicas, models = await db.list_replica_states(), await db.list_models()
        now = time.time()
        by_model: dict[str, list[ReplicaRecord]] = {}
        for r in replicas:
            by_model.setdefault(r.model, []).append(r)
        states = await db.autoscale_states()
        return {"items": [modeldocs.model_doc(m, by_model.get(m.model.name, []), now, states) for m in models]}

    @api.get("/api/v1/models/{name}", response_model=schemas.ModelDoc, response_model_exclude_unset=True)
    async def get_model(name: str) -> dict[str, Any]:
        stored = await _stored(db, name)
        return modeldocs.model_doc(stored, await _replicas_of(db, name), time.time(), await db.autoscale_states(),
                                   cluster.signals)

    @api.get("/api/v1/models/{name}/describe", response_model=schemas.ModelDescribe,
             response_model_exclude_unset=True)
    async def describe_model(name: str) -> dict[str, Any]:
        stored = await _stored(db, name)
        now, states = time.time(), await db.autoscale_states()
        mine = await _replicas_of(db, name)
        events = await db.list_events(model=name, limit=modeldocs.DESCRIBE_EVENTS)
        return modeldocs.describe_doc(stored, mine, events, cluster, states, now)

    api.include_router(_changes(db, cluster))
    return api


def _changes(db: StoreThread, cluster: Cluster) -> APIRouter:
    """Apply (POST, or PUT by name), scale by hand, delete; each change is an event and kicks a pass."""
    api = APIRouter()
    model_route: dict[str, Any] = {"response_model": schemas.ModelDoc, "response_model_exclude_unset": True}

    async def _apply(model: specs.Model, response: Response) -> dict[str, Any]:
        before = await db.get_model(model.name)
        stored, created = await db.put_model(model)
        if before is None or before.generation != stored.generation:
            rolls = before is not None and before.model.spec.fingerprint() != model.spec.fingerprint()
            cluster.record(ev.Event(time.time(), ev.NORMAL, "Created" if created else "Updated",
                                    f"model/{model.name}", f"generation {stored.generation} applied"
                                    + ("; the engine changed, so its replicas are rolled" if rolls else ""),
                                    model=model.name))
            cluster.flush_events()
        cluster.kick()
        response.status_code = 201 if created else 200
        return modeldocs.model_doc(stored, await _replicas_of(db, model.name), time.time(),
                                   await db.autoscale_states())

    @api.post("/api/v1/models", **model_route)
    async def apply_model(request: Request, response: Response) -> dict[str, Any]:
        """Creates or updates the model the body describes (201 when new)."""
        return await _apply(await read_manifest(db, request), response)

    @api.put("/api/v1/models/{name}", **model_route)
    async def put_model(name: str, request: Request, response: Response) -> dict[str, Any]:
        model = await read_manifest(db, request)
        if model.name != name:
            raise BadRequest(f"metadata.name is {model.name!r} but the URL names {name!r}", code="name_mismatch",
                             param="metadata.name")
        return await _apply(model, response)

    @api.post("/api/v1/models/{name}/scale", **model_route)
    async def scale_model(name: str, request: Request, response: Response) -> dict[str, Any]:
        """Sets a model's replica count by hand (``{"replicas": N}``); refused (409) for an autoscaled model."""
        replicas = _replica_count(read_json(await request.body(), limit=None))
        stored = await _stored(db, name)
        auto = stored.model.spec.autoscale
        if auto is not None:
            # The autoscaler would undo a count set by hand at its next decision: say where the count comes from.
            raise Conflict(f"model {name} is autoscaled (min {auto.min_replicas}, max {auto.max_replicas}); "
                           "change spec.autoscale.min_replicas/max_replicas instead", code="autoscaled",
                           param="replicas")
        model = dataclasses.replace(stored.model, spec=dataclasses.replace(stored.model.spec, replicas=replicas))
        return await _apply(model, response)

    @api.delete("/api/v1/models/{name}", response_model=schemas.Deleted)
    async def delete_model(name: str) -> dict[str, Any]:
        stored = await _stored(db, name)
        if mine := adapterkind.attached(stored.model):
            raise Conflict(f"model {name} has adapters applied on their own ({', '.join(mine)}); delete them first "
                           f"(`llmgw delete adapter {mine[0]}`), then the model", code="has_adapters")
        if not await db.delete_model(name):
            await _stored(db, name)
        cluster.record(ev.Event(time.time(), ev.NORMAL, "Deleted", f"model/{name}",
                                "deleted; its replicas are drained and stopped", model=name))
        cluster.flush_events()
        cluster.kick()
        return {"deleted": name}

    return api
