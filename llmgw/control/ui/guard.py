"""What stands around every UI route: the session check, the browser's security headers, and the peer passed in.

``SessionGuard`` asks the API who the browser's cookie is (``/api/v1/whoami``, in-process) before any page,
fragment or form handler runs: a cookie that is no live session goes to the login like no cookie at all.
It checked only that a cookie was present before, so ``Cookie: llmgw_session=x`` reached every handler.

``SecurityHeaders`` puts ``SECURITY_HEADERS`` on every answer below ``/ui`` (pages, fragments, redirects,
static files, 404s): a Content-Security-Policy with no inline script (the pages' JavaScript is in
``static/``, htmx is configured for it in ``base.html``), no framing, and no content sniffing. A script that
gets into a page all the same (a missed escape) is then not run.

``PeerFromUi`` wraps the REST app for the UI's in-process client only: it sets the scope's ``client`` to
the browser's address (``PEER_HEADER``, which only the UI sets, on that path alone), so the login limit
and the audit log see the browser, not 127.0.0.1 for every UI login. A request from outside never passes
through it, so sending that header to the server changes nothing.
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The UI's policy: its own scripts, styles, images and fetches only; no inline script or style, no eval
#: (htmx's ``allowEval`` is off), no plugins, no <base> rewrite, forms post only here, framed by nobody.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
)
#: Set by the UI on its in-process API calls only: the browser's address. Read by ``PeerFromUi`` alone.
PEER_HEADER = "x-llmgw-ui-peer"
#: Where ``SessionGuard`` leaves the caller's (name, role) for ``Ui.who``: one whoami per request, not two.
WHO = "llmgw.ui.who"


class Sessions(Protocol):
    """What ``SessionGuard`` asks of the UI (``common.Ui``): who a request is, and the way to the login."""

    async def session(self, request: Request) -> tuple[str, str] | None: ...

    def to_login(self, request: Request) -> Response: ...


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every HTTP answer of the wrapped app, replacing any of the same name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        names = {k for k, _ in SECURITY_HEADERS}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in names]
                message = {**message, "headers": [*kept, *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class SessionGuard:
    """Every route but the login's, the logout's, the SSO sign-in's and the static files' needs a live session (or an
    ``--insecure`` server, where the API lets anyone in and no login exists); otherwise the login.

    The one place that says so: with the check in each handler, a new page that forgot it would show its
    frame to anyone (``SessionEnded`` still sends a page to the login if its session ends mid-request).
    """

    #: Below the mount: what a browser without a session may reach.
    OPEN = ("/login", "/logout", "/sso/start", "/sso/callback")
    OPEN_UNDER = "/static/"

    def __init__(self, app: ASGIApp, ui: Sessions) -> None:
        self.app, self.ui = app, ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")[len(scope.get("root_path", "")):]
            if path not in self.OPEN and not path.startswith(self.OPEN_UNDER):
                request = Request(scope)
                who = await self.ui.session(request)
                if who is None:
                    await self.ui.to_login(request)(scope, receive, send)
                    return
                scope[WHO] = who
        await self.app(scope, receive, send)


class PeerFromUi:
    """The REST app as the UI's in-process client calls it: the scope's ``client`` is the browser's address."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            key = PEER_HEADER.encode()
            headers = scope.get("headers", ())
            peer = next((v.decode("latin-1") for k, v in headers if k.lower() == key), "")
            scope = {**scope, "headers": [(k, v) for k, v in headers if k.lower() != key]}
            if peer:
                scope["client"] = (peer, 0)
        await self.app(scope, receive, send)
