"""``/api/v1/users``: users made, listed, given a role or a new password, and deleted.

A user's password is generated here (never chosen over the API, so never weak and never
reused) and answered once, in the reply that made or reset it; the store keeps its argon2
hash. Deleting a user deletes their tokens with it, and resetting a password ends every token
and session the user had. The last administrator can be neither deleted nor demoted: a
cluster nobody can administer is fixed only by editing its database. Logging in is ``login``'s,
routers' credentials ``routercreds``'s.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pydantic
from fastapi import APIRouter

from llmgw.control import datadir
from llmgw.control.auth import passwords, principals
from llmgw.control.auth.credentials import Auth
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import BadRequest, Conflict, NotFound
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import StoredUser

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,62}")
_NAME_RULE = "1 to 63 of letters, digits, '.', '_', '@' and '-', starting with a letter or digit"


def check_name(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        raise BadRequest(f"{what} name {name[:80]!r} is not valid: {_NAME_RULE}", code="invalid_name", param="name")
    return name


def _check_role(role: str) -> str:
    if role not in principals.USER_ROLES:
        raise BadRequest(f"role {role[:40]!r} is not one of {', '.join(principals.USER_ROLES)}", code="invalid_role",
                         param="role")
    return role


class UserCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=256)
    role: str = pydantic.Field(max_length=64)


class UserChange(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    role: str | None = pydantic.Field(default=None, max_length=64)
    reset_password: bool = False


class User(schemas.Body):
    name: str
    role: str
    created_at: schemas.Number
    source: str = pydantic.Field(default="local", description="local (a password) or sso (single sign-on)")


class UserList(schemas.Body):
    items: list[User]


class UserChanged(schemas.Body):
    """A user made or changed; ``password`` only when one was made (shown this once)."""

    name: str
    role: str
    password: str = pydantic.Field(default="", description="Only when made or reset")


def user_doc(u: StoredUser) -> dict[str, Any]:
    """A user as listed: never the hash."""
    return {"name": u.name, "role": u.role, "created_at": u.created_at, "source": u.source}


def last_admin(name: str) -> Conflict:
    return Conflict(f"user {name!r} is the last administrator; make another admin first", code="last_admin")


def router(db: StoreThread, auth: Auth) -> APIRouter:
    r = APIRouter()
    changed = {"response_model": UserChanged, "response_model_exclude_unset": True}

    async def _admins() -> int:
        return sum(1 for u in await db.call(db.store.list_users) if u.role == principals.ADMIN)

    async def _user(name: str) -> StoredUser:
        user = await db.call(db.store.get_user, name)
        if user is None:
            raise NotFound("user", name[:80], "`llmgw user list` lists them")
        return user

    @r.get("/api/v1/users", response_model=UserList)
    async def list_users() -> dict[str, Any]:
        return {"items": [user_doc(u) for u in await db.call(db.store.list_users)]}

    @r.post("/api/v1/users", status_code=201, **changed)
    async def create_user(body: UserCreate) -> dict[str, Any]:
        """Creates a user with a generated password, answered this once."""
        name, role = check_name(body.name, "user"), _check_role(body.role)
        if await db.call(db.store.get_user, name) is not None:
            raise Conflict(f"user {name!r} already exists; `llmgw user reset-password {name}` gives a new password",
                           code="user_exists")
        password = passwords.new_password()
        # argon2 takes tens of milliseconds of CPU: on the loop it would hold every stream and request.
        hashed = await asyncio.to_thread(passwords.hash_password, password)
        await db.call(db.store.put_user, StoredUser(name, role, hashed, time.time()))
        return {"name": name, "role": role, "password": password}

    @r.put("/api/v1/users/{name}", **changed)
    async def change_user(name: str, body: UserChange) -> dict[str, Any]:
        """Changes a user's role, and with ``reset_password`` gives a new password (ending their tokens)."""
        user = await _user(name)
        role = _check_role(body.role) if body.role is not None else user.role
        if user.role == principals.ADMIN and role != principals.ADMIN and await _admins() <= 1:
            raise last_admin(name)
        answer: dict[str, Any] = {"name": name, "role": role}
        hashed = user.password_hash
        if body.reset_password and user.source == "sso":
            raise BadRequest(f"user {name} signs in through single sign-on and has no password: its access comes "
                             "from its groups at the identity provider (`llmgw user delete` ends it here)",
                             code="sso_user", param="reset_password")
        if body.reset_password:
            answer["password"] = passwords.new_password()
            hashed = await asyncio.to_thread(passwords.hash_password, answer["password"])
        await db.call(db.store.put_user, StoredUser(name, role, hashed, user.created_at, user.source))
        if body.reset_password:  # whoever had the old password may have made tokens with it
            await db.call(db.store.delete_api_tokens, subject=name, kinds=("user", "session"))
            if name == datadir.ADMIN:  # the first password's file holds one that no longer works
                datadir.forget_initial_password(auth.initial_password)
        auth.forget_cached()
        return answer

    @r.delete("/api/v1/users/{name}", response_model=schemas.Deleted)
    async def delete_user(name: str) -> dict[str, Any]:
        """Deletes a user and every token and session of theirs."""
        user = await _user(name)
        if user.role == principals.ADMIN and await _admins() <= 1:
            raise last_admin(name)
        await db.call(db.store.delete_user, name)
        if name == datadir.ADMIN:
            datadir.forget_initial_password(auth.initial_password)
        auth.forget_cached()
        return {"deleted": name}

    return r
