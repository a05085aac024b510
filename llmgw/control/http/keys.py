"""``/api/v1/keys``: API keys for the router's clients, created, listed, disabled, enabled and deleted.

A key's id is ``key-`` plus 96 random bits in hex: the 24 bits ids had before made a clash (a 500)
about even odds by 4,800 keys. A clash is drawn again all the same (``router``'s ``new_id`` is there to
force one in a test); ids made before, ``key-`` and six hex digits, stay valid as they are.

A key's secret is ``llmgw-`` plus 32 random bytes (url-safe base64) and is
answered once, in the 201 to its creation; the store keeps only its sha256, and
no listing ever carries either. Any change kicks the cluster, whose next table
(``auth`` in ``GET /api/v1/endpoints``) carries the new hashes to the router; a
disabled key is left out of it, so routers refuse it (401) as they do a deleted
one, and enabling it puts it back with the same secret.

Keys belong to a project (``default`` unless said) and optionally a user (issue 26). Any logged-in
user reaches these paths; ``auth.projectaccess`` decides the rest: operators and admins every key, a
project's owner every key of the project, a member its own (``user`` itself) there. Only operators and
admins set a key's ``limits``. A key the caller may not see is answered as one that does not exist.

``last_used_at`` is when a router last let the key call the OpenAI API, as routers
report it (``control.keyuse``); 0 means never.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

import pydantic
from fastapi import APIRouter, Depends, Request, Response

from llmgw.control.auth.projectaccess import limits_refusal
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound, Unavailable
from llmgw.control.http.projects import access_of, denied, gate, limits_from, no_project, printable
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import KeyIdTaken, StoredKey, UnknownProject
from llmgw.core import quota

SECRET_PREFIX = "llmgw-"


#: Draws for a key id before giving up: with 96 bits a second clash in a row means the generator is broken.
ID_TRIES = 5


def new_key_id() -> str:
    """``key-`` and 24 hex digits (96 random bits)."""
    return f"key-{secrets.token_hex(12)}"


class _Kicker(Protocol):
    def kick(self) -> None: ...


#: The largest rate limit a key may state (the store's integers are 64-bit).
_MAX_LIMIT = 2**63 - 1


class KeyCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(min_length=1, max_length=63)
    models: list[str] = pydantic.Field(default_factory=list, max_length=1000)
    # Bounded by what the store's integers hold: past 2**63 SQLite refused the row with a 500.
    rpm: int = pydantic.Field(default=0, ge=0, le=_MAX_LIMIT)
    tpm: int = pydantic.Field(default=0, ge=0, le=_MAX_LIMIT)
    priority: int = pydantic.Field(default=0, ge=-1000, le=1000)
    project: str = pydantic.Field(default=quota.DEFAULT_PROJECT, max_length=63)
    user: str = pydantic.Field(default="", max_length=63, description="The user the key is for; '': the project's")
    limits: dict[str, Any] = pydantic.Field(default_factory=dict, description="A partial core.quota.Limits document")

    _printable = pydantic.field_validator("name", "models", "project", "user")(printable)


class KeyUpdate(pydantic.BaseModel):
    """What ``PATCH /api/v1/keys/{id}`` changes; a field left out stays as it is."""

    model_config = pydantic.ConfigDict(extra="forbid")

    models: list[str] | None = pydantic.Field(default=None, max_length=1000)
    rpm: int | None = pydantic.Field(default=None, ge=0, le=_MAX_LIMIT)
    tpm: int | None = pydantic.Field(default=None, ge=0, le=_MAX_LIMIT)
    limits: dict[str, Any] | None = pydantic.Field(default=None, description="Partial: 0 or null removes a kind")

    _printable = pydantic.field_validator("models")(printable)


class Key(schemas.Body):
    """A key as listed: never its secret, never its hash."""

    id: str
    name: str
    models: list[str]
    rpm: int
    tpm: int
    priority: int
    created_at: schemas.Number
    disabled: bool
    last_used_at: schemas.Number
    project: str
    user: str
    limits: dict[str, schemas.Number]


class KeyCreated(Key):
    key: str = pydantic.Field(description="The secret, shown this once")


class KeyList(schemas.Body):
    items: list[Key]


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    # sha256, not argon2: the secret is 32 random bytes, so there is nothing to
    # brute-force that a slow hash would protect, and argon2 on every request
    # would cost the router milliseconds of CPU on its hot path.
    return hashlib.sha256(secret.encode()).hexdigest()


def key_doc(key: StoredKey) -> dict[str, Any]:
    """A key as the REST API lists it: never the secret, never the hash."""
    return {"id": key.id, "name": key.name, "models": list(key.models), "rpm": key.rpm, "tpm": key.tpm,
            "priority": key.priority, "created_at": key.created_at, "disabled": key.disabled,
            "last_used_at": key.last_used_at, "project": key.project, "user": key.user,
            "limits": key.limits.to_doc()}


def _missing(key_id: str) -> NotFound:
    return NotFound("key", key_id, "`llmgw key list` lists them")


def router(db: StoreThread, cluster: _Kicker, *, new_id: Callable[[], str] = new_key_id) -> APIRouter:
    """``new_id`` draws a key's id (a test gives one that clashes)."""
    r = APIRouter(dependencies=[Depends(gate(db))])

    async def mine(request: Request, key_id: str) -> StoredKey:
        """The key, when the caller may change it; else 404 (not seen) or 403 (seen, not theirs to change)."""
        access = await access_of(request, db)
        key = await db.call(db.store.get_key, key_id)
        if key is None or not access.sees_key(key.project, key.user):
            raise _missing(key_id)
        if not access.changes_key(key.project, key.user):
            raise denied(access.why_not(f"changing key {key_id}", key.project))
        return key

    @r.post("/api/v1/keys", status_code=201, response_model=KeyCreated)
    async def create_key(body: KeyCreate, response: Response, request: Request) -> dict[str, Any]:
        """Creates a key in a project (``default`` unless said); the answer's ``key`` is the secret, shown once."""
        access = await access_of(request, db)
        project, user = body.project.strip(), body.user.strip()
        if not access.sees_project(project):
            raise no_project(project)
        if not user and not access.manages_project(project):
            user = access.user  # a member's key is its own: saying so is not needed
        if not access.makes_key(project, user):
            raise denied(access.why_not("creating a key", project))
        limits = limits_from(body.limits)
        if limits.any and not access.manager:
            raise denied(limits_refusal(access.principal))
        models = [m.strip() for m in body.models if m.strip()]
        secret = new_secret()
        for _ in range(ID_TRIES):
            try:
                key = await db.add_key(StoredKey(id=new_id(), name=body.name.strip(), sha256=hash_secret(secret),
                                                 models=tuple(models), rpm=body.rpm, tpm=body.tpm,
                                                 priority=body.priority, created_at=time.time(), project=project,
                                                 user=user, limits=limits))
                break
            except KeyIdTaken:
                continue
            except UnknownProject:
                raise no_project(project) from None
        else:
            raise Unavailable(f"no free key id in {ID_TRIES} draws; try again, and if it persists report it",
                              code="key_id_taken")
        cluster.kick()
        response.status_code = 201
        return {**key_doc(key), "key": secret}

    @r.get("/api/v1/keys", response_model=KeyList)
    async def list_keys(request: Request, project: str = "") -> dict[str, Any]:
        """The keys the caller may see (operators and admins: all; an owner: its projects'; others: their own);
        ``project`` keeps one project's."""
        access = await access_of(request, db)
        return {"items": [key_doc(k) for k in await db.list_keys()
                          if access.sees_key(k.project, k.user) and (not project or k.project == project)]}

    @r.patch("/api/v1/keys/{key_id}", response_model=Key)
    async def update_key(key_id: str, body: KeyUpdate, request: Request) -> dict[str, Any]:
        """Changes a key's models, rpm, tpm or limits (limits: operators and admins only); routers follow."""
        key = await mine(request, key_id)
        limits = None
        if body.limits is not None:
            access = await access_of(request, db)
            if not access.manager:
                raise denied(limits_refusal(access.principal))
            limits = limits_from(body.limits, key.limits)
        models = None if body.models is None else tuple(m.strip() for m in body.models if m.strip())
        changed = await db.call(db.store.update_key, key_id, models=models, rpm=body.rpm, tpm=body.tpm, limits=limits)
        if changed is None:
            raise _missing(key_id)
        cluster.kick()
        return key_doc(changed)

    @r.delete("/api/v1/keys/{key_id}", response_model=schemas.Deleted)
    async def delete_key(key_id: str, request: Request) -> dict[str, Any]:
        await mine(request, key_id)
        if not await db.delete_key(key_id):
            raise _missing(key_id)
        cluster.kick()
        return {"deleted": key_id}

    async def set_disabled(request: Request, key_id: str, disabled: bool) -> dict[str, Any]:
        await mine(request, key_id)
        key = await db.set_key_disabled(key_id, disabled)
        if key is None:
            raise _missing(key_id)
        cluster.kick()  # the next table leaves the key out (or puts it back): routers follow within a second or so
        return key_doc(key)

    @r.post("/api/v1/keys/{key_id}/disable", response_model=Key)
    async def disable_key(key_id: str, request: Request) -> dict[str, Any]:
        """Disables a key: routers refuse it (401) from their next table on; it stays listed, to enable again."""
        return await set_disabled(request, key_id, True)

    @r.post("/api/v1/keys/{key_id}/enable", response_model=Key)
    async def enable_key(key_id: str, request: Request) -> dict[str, Any]:
        """Enables a disabled key again, with the same secret."""
        return await set_disabled(request, key_id, False)

    return r
