"""``/api/v1/adapters``: LoRA adapters applied (``kind: Adapter``), listed and deleted on their own.

An adapter applied here joins its base model's ``spec.adapters`` in the model's stored manifest
(``core.adapterkind`` says how and why there), so applying one is applying its base model again: the same
checks (``models.check_model``), a new generation, an event on the model, a pass kicked.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response

from llmgw.control import events as ev
from llmgw.control.cluster import Cluster
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound, Unprocessable
from llmgw.control.http.models import check_model, read_body
from llmgw.control.store.offloop import StoreThread
from llmgw.core import adapterkind
from llmgw.core.errors import SpecError
from llmgw.core.specmodel import Model

_HINT = "`llmgw get adapters` lists them"


class AdapterEntry(schemas.Body):
    """One adapter: its name, the model it runs on, and whether a ``kind: Adapter`` or the model's file said it."""

    name: str
    base: str
    source: str
    rank: int
    applied: str


class AdapterList(schemas.Body):
    items: list[AdapterEntry]


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    api = APIRouter()

    async def _store(model: Model, what: str, name: str) -> None:
        before = await db.get_model(model.name)
        stored, _ = await db.put_model(model)
        if before is None or before.generation != stored.generation:
            cluster.record(ev.Event(time.time(), ev.NORMAL, "Updated", f"model/{model.name}",
                                    f"generation {stored.generation} applied: adapter {name} {what}",
                                    model=model.name))
            cluster.flush_events()
        cluster.kick()

    @api.get("/api/v1/adapters", response_model=AdapterList)
    async def list_adapters() -> dict[str, Any]:
        """Every model's adapters, from its file (``applied: Model``) or applied on their own (``Adapter``)."""
        return {"items": [e for m in await db.list_models() for e in adapterkind.entries(m.model)]}

    @api.post("/api/v1/adapters", response_model=AdapterEntry)
    async def apply_adapter(request: Request, response: Response) -> dict[str, Any]:
        """Creates or updates the ``kind: Adapter`` the body describes (201 when new), on its base model."""
        item = await read_body(request, adapterkind.parse)
        base = await db.get_model(item.base)
        if base is None:
            raise Unprocessable(f"spec.base: model {item.base!r} does not exist; apply it first (`llmgw get models` "
                                "lists them)", code="invalid_spec", param="spec.base")
        created = item.name not in adapterkind.attached(base.model)
        try:
            model = adapterkind.attach(base.model, item)
        except SpecError as e:
            raise Unprocessable(str(e), code="invalid_spec", param=e.field) from None
        await check_model(db, model, field_of=_adapter_field)
        await _store(model, "applied", item.name)
        response.status_code = 201 if created else 200
        return next(e for e in adapterkind.entries(model) if e["name"] == item.name)

    @api.delete("/api/v1/adapters/{name}", response_model=schemas.Deleted)
    async def delete_adapter(name: str) -> dict[str, Any]:
        for stored in await db.list_models():
            if name in {a.name for a in stored.model.spec.adapters}:
                try:
                    model = adapterkind.detach(stored.model, name)
                except SpecError as e:
                    raise Unprocessable(str(e), code="invalid_spec", param=e.field) from None
                await _store(model, "deleted", name)
                return {"deleted": name}
        raise NotFound("adapter", name, _HINT)

    return api


def _adapter_field(field: str) -> str:
    """A refusal of the joined model, named as the adapter file's field where it is one."""
    return "metadata.name" if field.startswith("spec.adapters") and field.endswith(".name") else field
