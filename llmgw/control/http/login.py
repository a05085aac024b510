"""``POST /api/v1/login`` and ``/logout``: a user's token or browser session for a right password, and its end.

A login answers a user token (30 days), or with ``session`` a session cookie (12 h, ``HttpOnly``,
``Secure``, ``SameSite=Strict``); a wrong password is 401 and too many of them 429 with ``Retry-After``
(``auth.credentials`` counts them). A login from another site's page is refused (``auth.middleware``).
"""

from __future__ import annotations

import pydantic
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from llmgw.control.auth import credentials, principals
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.auth.credentials import Auth, LoginRefused
from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import BadRequest, Forbidden, LoginFailed, TooManyLogins


class Login(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    username: str = pydantic.Field(min_length=1, max_length=256)
    password: str = pydantic.Field(max_length=1024)
    session: bool = False


class LoggedIn(schemas.Body):
    """A login's answer; ``token`` only without ``session`` (a session's is in its cookie)."""

    token: str = pydantic.Field(default="", description="Only without session")
    user: str
    role: str
    expires_at: schemas.Number


class LoggedOut(schemas.Body):
    logged_out: bool


def _peer(request: Request) -> str:
    """The login's address: the socket's peer, or for the admin UI's in-process call the browser's
    (``llmgw.control.ui.guard.PeerFromUi`` puts it in the scope; no header from outside can)."""
    return request.client.host if request.client else "unknown"


def router(auth: Auth) -> APIRouter:
    r = APIRouter()

    @r.post("/api/v1/login", response_model=LoggedIn)
    async def login(body: Login, request: Request) -> Response:
        """A user token (30 days), or with ``session`` a browser session cookie (12 h), for a right password."""
        if auth.is_insecure:
            raise BadRequest("this server runs with --insecure: nothing needs a login", code="insecure")
        if refusal := auth_mw.cross_site_login({k.lower(): v for k, v in request.headers.items()}):
            raise Forbidden.said(refusal, code="cross_site_login")
        try:
            done = await auth.login(body.username, body.password, peer=_peer(request), session=body.session)
        except LoginRefused as e:
            if e.retry_after:
                raise TooManyLogins(e.message, e.retry_after) from None
            raise LoginFailed(e.message) from None
        # For the audit log: a login that succeeded is recorded as the user it proved.
        request.scope[PRINCIPAL] = principals.Principal("user", done.user, done.role)
        if not body.session:
            return JSONResponse({"token": done.token, "user": done.user, "role": done.role,
                                 "expires_at": done.expires_at})
        resp = JSONResponse({"user": done.user, "role": done.role, "expires_at": done.expires_at})
        # Secure on HTTPS (a server behind a TLS proxy with --plain-http says https too); not on plain loopback,
        # where a browser that does not count http://127.0.0.1 as secure would drop a Secure cookie.
        resp.set_cookie(credentials.SESSION_COOKIE, done.token, max_age=int(credentials.SESSION_S), path="/",
                        httponly=True, secure=request.url.scheme == "https", samesite="strict")
        return resp

    @r.post("/api/v1/logout", response_model=LoggedOut)
    async def logout(request: Request) -> Response:
        """Ends the token or session this request was made with."""
        p: principals.Principal | None = request.scope.get(PRINCIPAL)
        ended = bool(p and p.token_id) and await auth.revoke(p.token_id if p else "")
        resp = JSONResponse({"logged_out": ended})
        resp.delete_cookie(credentials.SESSION_COOKIE, path="/", httponly=True, secure=request.url.scheme == "https",
                           samesite="strict")
        return resp

    return r
