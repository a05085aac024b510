"""The REST app's outermost middleware: no credential, no answer (but health and login).

It reads ``Authorization: Bearer <token>`` or, for the admin UI, the ``llmgw_session``
cookie; asks ``Auth`` who that is; checks the role against ``principals.required``; and
puts the principal at ``scope["llmgw.principal"]`` for the audit log and the handlers.
Refusals are the API's one error shape: 401 ``unauthenticated`` (nothing or nothing valid
was sent) and 403 ``forbidden`` (valid, but not enough), each saying what is missing.

A cookie is sent by the browser to every request to this host, whoever's page made it, so
a cookie-authenticated change must carry an ``Origin`` equal to this server's own (CSRF);
SameSite=Strict already stops modern browsers, this stops the rest. A bearer token is never
sent by a browser on its own, so it needs no such check. Two exceptions, both ways round: a logout
is let through from anywhere (ending a session is harmless cross-site, and a logout refused for its
missing Origin left the session alive for 12 hours while the UI cleared the cookie), and a login,
which needs no credential, is refused when a browser says it comes from another site
(``cross_site_login``): a forged login puts the victim in the attacker's account.

In insecure mode every request is ``principals.INSECURE`` and every answer carries
``X-Llmgw-Insecure: 1``, which the CLI turns into a warning on each command.
"""

from __future__ import annotations

import logging
import urllib.parse

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw.control.auth import principals
from llmgw.control.auth.credentials import SESSION_COOKIE, Auth
from llmgw.control.http.errors import error_body

log = logging.getLogger(__name__)
PRINCIPAL = "llmgw.principal"
INSECURE_HEADER = "x-llmgw-insecure"
LOGOUT = "/api/v1/logout"
_ROUTER_REACHES = ("a router credential reaches only GET /api/v1/endpoints, GET /api/v1/router/tokenizer/MODEL, "
                   "GET /api/v1/router/kv, POST /api/v1/router/events, POST /api/v1/router/signals, "
                   "POST /api/v1/router/usage, POST /api/v1/router/quota, POST /api/v1/router/batch/claim, "
                   "POST /api/v1/router/batch/results and /metrics")


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


def credential(headers: dict[str, str]) -> tuple[str, bool]:
    """``(token, from_cookie)``; ``("", False)`` when neither a bearer token nor the session cookie is there."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == SESSION_COOKIE and value:
            return value, True
    return "", False


def same_origin(headers: dict[str, str]) -> bool:
    """Whether the request's Origin names the host it was sent to."""
    origin, host = headers.get("origin", ""), headers.get("host", "")
    return bool(origin and host) and urllib.parse.urlsplit(origin).netloc.lower() == host.lower()


def cross_site_login(headers: dict[str, str]) -> str:
    """Why a login is refused as cross-site, or "" when it is not.

    A browser sends ``Origin`` on every form POST (``null`` from a sandboxed or privacy-stripped page); an
    older one may send only ``Referer``. A request with neither is not from a browser's page (a script, the
    CLI) and so not cross-site.
    """
    host = headers.get("host", "").lower()
    origin, referer = headers.get("origin"), headers.get("referer")
    said, value = ("Origin", origin) if origin is not None else ("Referer", referer)
    if value is None or (host and urllib.parse.urlsplit(value).netloc.lower() == host):
        return ""
    return (f"a login must come from this server's own login page, and the {said} header ({value[:100]!r}) does not "
            f"name {host[:100]!r}: refused as a possible cross-site login; open the login page at this server's "
            "own address (a script leaves Origin out or sends the server's own)")


def forbidden_message(p: principals.Principal, need: principals.Need, method: str, path: str) -> str:
    said = f"{p.describe()}; {method} {path} needs {need.describe()}"
    if p.role == principals.ROUTER:
        return f"{said}: {_ROUTER_REACHES}"
    if need.router and not need.role:
        return (f"{said}: it carries every engine's key, so only routers read it (`llmgw router-token create "
                "NAME` makes a router credential)")
    return f"{said}; an administrator can change the role with `llmgw user set-role {p.name} {need.role}`"


class AuthMiddleware:
    def __init__(self, app: ASGIApp, *, auth: Auth) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.auth.is_insecure:
            scope[PRINCIPAL] = principals.INSECURE

            async def send_marked(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), (b"x-llmgw-insecure", b"1")]}
                await send(message)

            await self.app(scope, receive, send_marked)
            return
        method, path = scope.get("method", ""), scope.get("path", "")
        need = principals.required(method, path)
        if need is None:
            await self.app(scope, receive, send)
            return
        shown = path if len(path) <= 200 else path[:200] + "…"
        headers = _headers(scope)
        token, from_cookie = credential(headers)
        if not token:
            await _refuse(401, "unauthenticated", f"{method} {shown} needs a credential and none was sent: log in "
                          "with `llmgw login` or set LLMGW_TOKEN (over HTTP: `Authorization: Bearer <token>`)",
                          scope, receive, send)
            return
        p = await self.auth.principal(token)
        if p is None:
            await _refuse(401, "unauthenticated", "the credential sent is not valid (unknown, expired, logged out, "
                          "or its user or router was deleted): log in again with `llmgw login` or set LLMGW_TOKEN "
                          "to a valid token", scope, receive, send)
            return
        # Known from here, refused or not: the audit log (outside this middleware) names who tried.
        scope[PRINCIPAL] = p
        if (from_cookie and method not in ("GET", "HEAD") and not same_origin(headers)
                and not (method == "POST" and path == LOGOUT)):
            origin = headers.get("origin", "")
            await _refuse(403, "forbidden", f"a change made with the session cookie must come from this server's "
                          f"own pages, and the Origin header ({origin[:100]!r}) does not name {headers.get('host')!r}"
                          ": refused as a possible cross-site request; a script sends `Authorization: Bearer "
                          "<token>` instead", scope, receive, send)
            return
        if not need.allows(p):
            log.info("%s refused %s %s (needs %s)", p.actor, method, shown, need.describe())
            await _refuse(403, "forbidden", forbidden_message(p, need, method, shown), scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _refuse(status: int, code: str, message: str, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    type_ = "authentication_error" if status == 401 else "permission_error"
    await JSONResponse(error_body(message, type_=type_, code=code), status_code=status, headers=headers)(
        scope, receive, send)
