"""Users, routers' credentials, and logging in and out (``/api/v1/users``, ``/routers``, ``/login``, ``/logout``).

A user's password is generated here (never chosen over the API, so never weak and never
reused) and answered once, in the reply that made or reset it; the store keeps its argon2
hash. A router's token is answered once the same way; the store keeps its sha256. Deleting
a user or a router deletes its tokens with it, and resetting a password ends every token
and session the user had. The last administrator can be neither deleted nor demoted: a
cluster nobody can administer is fixed only by editing its database.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pydantic
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from llmgw.control import datadir
from llmgw.control.auth import credentials, passwords, principals
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.auth.credentials import Auth, LoginRefused
from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http.errors import ApiError, error_body
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import StoredUser

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,62}")
_NAME_RULE = "1 to 63 of letters, digits, '.', '_', '@' and '-', starting with a letter or digit"


def _check_name(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        raise ApiError(400, f"{what} name {name[:80]!r} is not valid: {_NAME_RULE}", code="invalid_name",
                       param="name")
    return name


def _check_role(role: str) -> str:
    if role not in principals.USER_ROLES:
        raise ApiError(400, f"role {role[:40]!r} is not one of {', '.join(principals.USER_ROLES)}",
                       code="invalid_role", param="role")
    return role


class Login(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    username: str = pydantic.Field(min_length=1, max_length=256)
    password: str = pydantic.Field(max_length=1024)
    session: bool = False


class UserCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=256)
    role: str = pydantic.Field(max_length=64)


class UserChange(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    role: str | None = pydantic.Field(default=None, max_length=64)
    reset_password: bool = False


class RouterCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=256)


def user_doc(u: StoredUser) -> dict[str, Any]:
    """A user as listed: never the hash."""
    return {"name": u.name, "role": u.role, "created_at": u.created_at}


def _peer(request: Request) -> str:
    """The login's address: the socket's peer, or for the admin UI's in-process call the browser's
    (``llmgw.control.ui.guard.PeerFromUi`` puts it in the scope; no header from outside can)."""
    return request.client.host if request.client else "unknown"


def router(db: StoreThread, auth: Auth) -> APIRouter:
    r = APIRouter()

    @r.post("/api/v1/login")
    async def login(body: Login, request: Request) -> Response:
        """A user token (30 days), or with ``session`` a browser session cookie (12 h), for a right password."""
        if auth.is_insecure:
            raise ApiError(400, "this server runs with --insecure: nothing needs a login", code="insecure")
        if refusal := auth_mw.cross_site_login({k.lower(): v for k, v in request.headers.items()}):
            raise ApiError(403, refusal, code="cross_site_login", type_="permission_error")
        try:
            done = await auth.login(body.username, body.password, peer=_peer(request), session=body.session)
        except LoginRefused as e:
            if e.retry_after:
                return JSONResponse(error_body(e.message, type_="rate_limit_error", code="too_many_logins"),
                                    status_code=429, headers={"Retry-After": str(int(e.retry_after) + 1)})
            return JSONResponse(error_body(e.message, type_="authentication_error", code="login_failed"),
                                status_code=401)
        # For the audit log: a login that succeeded is recorded as the user it proved.
        request.scope[PRINCIPAL] = principals.Principal("user", done.user, done.role)
        if not body.session:
            return JSONResponse({"token": done.token, "user": done.user, "role": done.role,
                                 "expires_at": done.expires_at})
        resp = JSONResponse({"user": done.user, "role": done.role, "expires_at": done.expires_at})
        resp.set_cookie(credentials.SESSION_COOKIE, done.token, max_age=int(credentials.SESSION_S), path="/",
                        httponly=True, secure=True, samesite="strict")
        return resp

    @r.post("/api/v1/logout")
    async def logout(request: Request) -> Response:
        """Ends the token or session this request was made with."""
        p: principals.Principal | None = request.scope.get(PRINCIPAL)
        ended = bool(p and p.token_id) and await auth.revoke(p.token_id if p else "")
        resp = JSONResponse({"logged_out": ended})
        resp.delete_cookie(credentials.SESSION_COOKIE, path="/", httponly=True, secure=True, samesite="strict")
        return resp

    async def _admins() -> int:
        return sum(1 for u in await db.call(db.store.list_users) if u.role == principals.ADMIN)

    async def _user(name: str) -> StoredUser:
        user = await db.call(db.store.get_user, name)
        if user is None:
            raise ApiError(404, f"user {name[:80]!r} does not exist; `llmgw user list` lists them",
                           code="user_not_found")
        return user

    @r.get("/api/v1/users")
    async def list_users() -> dict[str, Any]:
        return {"items": [user_doc(u) for u in await db.call(db.store.list_users)]}

    @r.post("/api/v1/users", status_code=201)
    async def create_user(body: UserCreate) -> dict[str, Any]:
        """Creates a user with a generated password, answered this once."""
        name, role = _check_name(body.name, "user"), _check_role(body.role)
        if await db.call(db.store.get_user, name) is not None:
            raise ApiError(409, f"user {name!r} already exists; `llmgw user reset-password {name}` gives a new "
                           "password", code="user_exists")
        password = passwords.new_password()
        # argon2 takes tens of milliseconds of CPU: on the loop it would hold every stream and request.
        hashed = await asyncio.to_thread(passwords.hash_password, password)
        await db.call(db.store.put_user, StoredUser(name, role, hashed, time.time()))
        return {"name": name, "role": role, "password": password}

    @r.put("/api/v1/users/{name}")
    async def change_user(name: str, body: UserChange) -> dict[str, Any]:
        """Changes a user's role, and with ``reset_password`` gives a new password (ending their tokens)."""
        user = await _user(name)
        role = _check_role(body.role) if body.role is not None else user.role
        if user.role == principals.ADMIN and role != principals.ADMIN and await _admins() <= 1:
            raise ApiError(409, f"user {name!r} is the last administrator; make another admin first",
                           code="last_admin")
        answer: dict[str, Any] = {"name": name, "role": role}
        hashed = user.password_hash
        if body.reset_password:
            answer["password"] = passwords.new_password()
            hashed = await asyncio.to_thread(passwords.hash_password, answer["password"])
        await db.call(db.store.put_user, StoredUser(name, role, hashed, user.created_at))
        if body.reset_password:  # whoever had the old password may have made tokens with it
            await db.call(db.store.delete_api_tokens, subject=name, kinds=("user", "session"))
            if name == datadir.ADMIN:  # the first password's file holds one that no longer works
                datadir.forget_initial_password(auth.initial_password)
        auth.forget_cached()
        return answer

    @r.delete("/api/v1/users/{name}")
    async def delete_user(name: str) -> dict[str, Any]:
        """Deletes a user and every token and session of theirs."""
        user = await _user(name)
        if user.role == principals.ADMIN and await _admins() <= 1:
            raise ApiError(409, f"user {name!r} is the last administrator; make another admin first",
                           code="last_admin")
        await db.call(db.store.delete_user, name)
        if name == datadir.ADMIN:
            datadir.forget_initial_password(auth.initial_password)
        auth.forget_cached()
        return {"deleted": name}

    @r.post("/api/v1/routers", status_code=201)
    async def create_router(body: RouterCreate) -> dict[str, Any]:
        """A credential for a standalone router (`llmgw router --token-file`), answered this once."""
        name = _check_name(body.name, "router")
        if await db.call(db.store.list_api_tokens, kind="router", subject=name):
            raise ApiError(409, f"router {name!r} already has a credential; `llmgw router-token delete {name}` "
                           "first to replace it", code="router_exists")
        token, _ = await auth.issue(kind="router", subject=name)
        return {"name": name, "token": token}

    @r.get("/api/v1/routers")
    async def list_routers() -> dict[str, Any]:
        """Routers' credentials: names and dates, never a secret."""
        return {"items": [{"name": t.subject, "id": t.id, "created_at": t.created_at,
                           "last_used_at": t.last_used_at}
                          for t in await db.call(db.store.list_api_tokens, kind="router")]}

    @r.delete("/api/v1/routers/{name}")
    async def delete_router(name: str) -> dict[str, Any]:
        """Deletes a router's credential; it is refused from the next request."""
        if not await db.call(db.store.delete_api_tokens, subject=name, kinds=("router",)):
            raise ApiError(404, f"router {name[:80]!r} has no credential; `llmgw router-token list` lists them",
                           code="router_not_found")
        auth.forget_cached()
        return {"deleted": name}

    return r
