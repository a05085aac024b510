"""``/api/v1/routers``: standalone routers' credentials, made (the token answered once), listed and deleted.

The store keeps a router token's sha256, never the token; deleting a router's credential refuses it from
the router's next request. What routers read and report with it is ``routers``'s.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter

from llmgw.control.auth.credentials import Auth
from llmgw.control.http import schemas, users
from llmgw.control.http.apierrors import Conflict, NotFound
from llmgw.control.store.offloop import StoreThread


class RouterCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=256)


class RouterToken(schemas.Body):
    """A router's credential as made: its token, shown this once."""

    name: str
    token: str


class RouterCred(schemas.Body):
    name: str
    id: str
    created_at: schemas.Number
    last_used_at: schemas.Number


class RouterCredList(schemas.Body):
    items: list[RouterCred]


def router(db: StoreThread, auth: Auth) -> APIRouter:
    r = APIRouter()

    @r.post("/api/v1/routers", status_code=201, response_model=RouterToken)
    async def create_router(body: RouterCreate) -> dict[str, Any]:
        """A credential for a standalone router (`llmgw router --token-file`), answered this once."""
        name = users.check_name(body.name, "router")
        if await db.call(db.store.list_api_tokens, kind="router", subject=name):
            raise Conflict(f"router {name!r} already has a credential; `llmgw router-token delete {name}` first to "
                           "replace it", code="router_exists")
        token, _ = await auth.issue(kind="router", subject=name)
        return {"name": name, "token": token}

    @r.get("/api/v1/routers", response_model=RouterCredList)
    async def list_routers() -> dict[str, Any]:
        """Routers' credentials: names and dates, never a secret."""
        return {"items": [{"name": t.subject, "id": t.id, "created_at": t.created_at,
                           "last_used_at": t.last_used_at}
                          for t in await db.call(db.store.list_api_tokens, kind="router")]}

    @r.delete("/api/v1/routers/{name}", response_model=schemas.Deleted)
    async def delete_router(name: str) -> dict[str, Any]:
        """Deletes a router's credential; it is refused from the next request."""
        if not await db.call(db.store.delete_api_tokens, subject=name, kinds=("router",)):
            raise NotFound("router", name[:80], "`llmgw router-token list` lists them", says="has no credential")
        auth.forget_cached()
        return {"deleted": name}

    return r
