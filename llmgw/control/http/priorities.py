"""Priority classes and weights of keys and projects (issue 32): ``/api/v1/priorities``, ``.../priority``.

- ``GET /api/v1/priorities``: the cluster's classes (highest first) and the class and weight of each key and
  project the caller may see;
- ``PUT /api/v1/keys/{id}/priority`` and ``PUT /api/v1/projects/{name}/priority``: set them, operators and admins
  only (a class is a share of the fleet, as a budget is): ``{"priority_class": C, "weight": W}``, either left out
  unchanged, ``""``/``0`` unset (the project's, else ``interactive`` and 1).

The classes themselves are the cluster setting ``priority_classes`` (``PUT /api/v1/settings``, an admin's). Stored in
``control.store.queueing``; the routers get them in the next table (the cluster is kicked). How they are used:
``core.queueclasses`` and ``core.fairqueue``.
"""

from __future__ import annotations

from typing import Any, Protocol

import pydantic
from fastapi import APIRouter, Depends, Request

from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound, Unprocessable
from llmgw.control.http.projects import access_of, denied, gate, no_project
from llmgw.control.store import queueing
from llmgw.control.store import settings as cluster_settings
from llmgw.control.store.offloop import StoreThread
from llmgw.core import queueclasses


class _Kicker(Protocol):
    def kick(self) -> None: ...


class PriorityChange(pydantic.BaseModel):
    """A ``PUT .../priority`` body; a field left out stays as it is."""

    model_config = pydantic.ConfigDict(extra="forbid")

    priority_class: str | None = pydantic.Field(default=None, max_length=32,
                                                description="A class of the cluster's priority_classes; '': unset")
    weight: float | None = pydantic.Field(default=None, description="A share within its class, 0.01 to 10000; 0: unset")


class Priority(schemas.Body):
    """A key's or project's class ("": its project's, else interactive) and weight (0: its project's, else 1)."""

    name: str
    priority_class: str
    weight: schemas.Number


class Priorities(schemas.Body):
    classes: list[str] = pydantic.Field(description="The cluster's priority classes, highest first")
    keys: list[Priority]
    projects: list[Priority]


def _doc(name: str, a: queueing.Assigned) -> dict[str, Any]:
    return {"name": name, "priority_class": a.priority_class, "weight": a.weight}


def router(db: StoreThread, cluster: _Kicker) -> APIRouter:
    r = APIRouter(dependencies=[Depends(gate(db))])

    async def need_manager(request: Request) -> None:
        access = await access_of(request, db)
        if not access.manager:
            raise denied(f"{access.principal.describe()}; a key's or project's priority class and weight are set by a "
                         "cluster operator or admin only (they are its share of the fleet)")

    async def changed(request: Request, kind: str, name: str, body: PriorityChange) -> dict[str, Any]:
        classes = (await db.call(cluster_settings.read, db.store)).priority_classes
        if body.priority_class and body.priority_class not in classes:
            raise Unprocessable(f"priority_class: {body.priority_class!r} is not one of the cluster's classes "
                                f"({', '.join(classes)}); add it to the setting priority_classes first "
                                "(`llmgw settings set priority_classes ...`) or pick one of them",
                                code="unknown_priority_class", param="priority_class")
        if body.weight is not None and (why := queueclasses.weight_refusal(body.weight)):
            raise Unprocessable(why, code="invalid_weight", param="weight")
        who = request.scope.get(PRINCIPAL)
        after = await db.call(queueing.change, db.store, kind, name, body.priority_class,
                              None if body.weight is None else float(body.weight),
                              by=who.name if who is not None else "")
        cluster.kick()
        return _doc(name, after)

    @r.get("/api/v1/priorities", response_model=Priorities)
    async def list_priorities(request: Request) -> dict[str, Any]:
        """The classes, and the class and weight of the keys and projects you may see that have one."""
        access = await access_of(request, db)
        settings, found = await db.call(cluster_settings.read, db.store), await db.call(queueing.read, db.store)
        keys = {k.id: k for k in await db.list_keys()}
        return {"classes": settings.priority_classes,
                "keys": [_doc(i, a) for i, a in sorted(found.keys.items())
                         if i in keys and access.sees_key(keys[i].project, keys[i].user)],
                "projects": [_doc(n, a) for n, a in sorted(found.projects.items()) if access.sees_project(n)]}

    @r.put("/api/v1/keys/{key_id}/priority", response_model=Priority)
    async def set_key_priority(key_id: str, body: PriorityChange, request: Request) -> dict[str, Any]:
        """Sets a key's class and weight (operators and admins): its requests queue as this when a model is busy."""
        await need_manager(request)
        if await db.call(db.store.get_key, key_id) is None:
            raise NotFound("key", key_id, "`llmgw key list` lists them")
        return await changed(request, "keys", key_id, body)

    @r.put("/api/v1/projects/{name}/priority", response_model=Priority)
    async def set_project_priority(name: str, body: PriorityChange, request: Request) -> dict[str, Any]:
        """Sets a project's class and weight (operators and admins), which its keys take unless they have their own."""
        await need_manager(request)
        if await db.call(db.store.get_project, name) is None:
            raise no_project(name)
        return await changed(request, "projects", name, body)

    return r
