"""The admin web UI: server-rendered pages over the REST API, with htmx for the live parts.

Every page gets its data by calling the REST app in-process with the browser's own credential
(``common.Ui``); each page lives in its own ``*_page.py`` module with a ``routes(ui)``, and this module
only assembles them. Mounted by ``llmgw.serve`` at ``/ui``; links are built from the mount's
``root_path``. Around the routes (``guard``): the session check, the browser's security headers (CSP),
and the browser's address passed to the in-process API calls.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw.control.ui import (
    audit_page,
    charts_page,
    deploy_page,
    guard,
    keys_page,
    login_page,
    models_page,
    nodes_page,
    overview_page,
    playground_page,
    projects_page,
    sso_page,
    usage_page,
    users_page,
)
from llmgw.control.ui.callbackurl import CallbackUrls
from llmgw.control.ui.common import HERE, SessionEnded, Ui


class _Bare:
    """``/ui`` without its slash goes to ``/ui/`` (the routes below the mount begin at ``/``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "")
        if scope["type"] == "http" and scope.get("path", "") in (root, root.rstrip("/")):
            await RedirectResponse(f"{root}/", status_code=303)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_ui(api: ASGIApp, *, callback_urls: CallbackUrls = CallbackUrls()) -> ASGIApp:
    """The UI's ASGI app over the REST app ``api`` (what ``create_api`` returns); mount it at ``/ui``.

    ``callback_urls``: which ``redirect_uri`` an SSO sign-in gives the provider (``callbackurl``)."""
    ui = Ui(api)

    async def session_ended(request: Request, exc: Exception) -> Response:
        return ui.to_login(request)

    pages = Starlette(exception_handlers={SessionEnded: session_ended}, routes=[
        *overview_page.routes(ui),
        *login_page.routes(ui),
        *sso_page.routes(ui, callback_urls),
        *keys_page.routes(ui),
        *projects_page.routes(ui),
        *models_page.routes(ui),
        *deploy_page.routes(ui),
        *nodes_page.routes(ui),
        *playground_page.routes(ui),
        *audit_page.routes(ui),
        *users_page.routes(ui),
        *usage_page.routes(ui),
        *charts_page.routes(ui),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ])
    # The security headers outermost, so the bare-path redirect and the guard's own answers carry them too.
    return guard.SecurityHeaders(_Bare(guard.SessionGuard(pages, ui)))
