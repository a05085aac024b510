"""The admin web UI: server-rendered pages over the REST API, with htmx for the live parts.

One source of truth: every page gets its data by calling the REST app in-process with the
browser's own credential (its ``cookie``, and its ``origin`` and ``host`` so the API's cross-site
check sees what the browser sent). No server-side admin token: a viewer's page shows exactly what a
viewer's API call shows, and an API refusal is what the page shows, in the API's words.

Mounted by ``llmgw.serve`` at ``/ui``; links are built from the mount's ``root_path``. Around the
routes (``guard``): the session check, the browser's security headers (CSP), and the browser's address
passed to the in-process API calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw.control.auth import credentials
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.ui import guard, traffic

_HERE = Path(__file__).parent
#: Node rows a page: a cluster of 1,000 nodes is ten pages, never a truncated table.
NODES_PER_PAGE = 100
#: Events the overview shows (the newest first), out of the last hour's.
EVENTS_SHOWN = 30

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _pct(used: float, total: float) -> int:
    return 0 if total <= 0 else max(0, min(100, round(100 * used / total)))


_env.filters["bytes"] = _bytes
_env.globals["pct"] = _pct
_env.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))


@dataclasses.dataclass(frozen=True, slots=True)
class ApiAnswer:
    """One in-process API call's outcome: the JSON on success, or the API's error message in words."""

    status: int
    doc: dict[str, Any]
    error: str = ""


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error", {})
        msg = err.get("message") if isinstance(err, dict) else None
    except ValueError:
        msg = None
    return str(msg) if msg else f"the API answered {resp.status_code} {resp.reason_phrase} without saying why"


#: A login form is two short fields; a bigger body is refused before it is parsed.
MAX_FORM = 16 * 1024


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields, first value each (parsed here: starlette's parser needs python-multipart)."""
    body = await request.body()
    if len(body) > MAX_FORM:
        return {}
    return {k: v[0] for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}


class SessionEnded(Exception):
    """The API answered 401 to the browser's credential: no session, or one that ended. Every page goes to the login.

    Raised by ``Ui.call`` and turned into the redirect by the app's one handler (``create_ui``), so no page
    handler checks for 401 itself: each one did before, and a new one that forgot would render the API's
    "needs a credential" sentence as if it were the page's content.
    """


class Ui:
    """The pages; owns the in-process client to the REST app."""

    def __init__(self, api: ASGIApp) -> None:
        # Through ``PeerFromUi``: the API sees the browser's address (the login limit, the audit log), not ours.
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=guard.PeerFromUi(api)),
                                        base_url="http://ui.internal", timeout=30)
        #: The API answers anyone as an administrator (``llmgw server --insecure``), as its own answers say
        #: (``X-Llmgw-Insecure``). Learned, never configured: a mode the process keeps for its whole life.
        self.insecure = False
        #: The router's counters as this process last read them: a rate is the change between two reads.
        self.traffic = traffic.Sampler()

    def bind(self, handler: Any) -> Any:
        """A Starlette endpoint calling ``handler(self, request)``: how a page module's handlers become routes."""
        async def endpoint(request: Request) -> Response:
            return await handler(self, request)
        return endpoint

    async def raw(self, request: Request, method: str, path: str, *, guarded: bool = True,
                  **kw: Any) -> httpx.Response:
        """The API's answer as it came (an NDJSON log, say); raises ``SessionEnded`` on a 401 unless not ``guarded``."""
        # The browser's own credential, origin and address, nothing of ours: the API decides as for the browser.
        headers = {k: v for k in ("cookie", "origin", "referer", "host") if (v := request.headers.get(k))}
        if request.client is not None:
            headers[guard.PEER_HEADER] = request.client.host
        resp = await self.client.request(method, path, headers=headers, **kw)
        self.insecure = self.insecure or bool(resp.headers.get(auth_mw.INSECURE_HEADER))
        if guarded and resp.status_code == 401:
            raise SessionEnded(_message(resp))
        return resp

    async def call(self, request: Request, method: str, path: str, *, guarded: bool = True,
                   **kw: Any) -> tuple[ApiAnswer, httpx.Response]:
        """One JSON call as the browser; a 401 ends the page at the login (``SessionEnded``) unless not ``guarded``."""
        resp = await self.raw(request, method, path, guarded=guarded, **kw)
        if resp.is_success:
            return ApiAnswer(resp.status_code, resp.json()), resp
        return ApiAnswer(resp.status_code, {}, _message(resp)), resp

    async def opens_without_login(self, request: Request) -> bool:
        """Whether the API lets a caller without a credential in (``--insecure``); asked once, as the API itself."""
        if not self.insecure:
            await self.raw(request, "GET", "/api/v1/whoami", guarded=False)
        return self.insecure

    async def session(self, request: Request) -> tuple[str, str] | None:
        """The caller's (name, role) as the API says (``/api/v1/whoami``); None when it refuses the credential
        (none, made up, or ended: the login instead); empty names when it fails otherwise (the page says why)."""
        answer, _ = await self.call(request, "GET", "/api/v1/whoami", guarded=False)
        if answer.status == 401:
            return None
        return str(answer.doc.get("name", "")), str(answer.doc.get("role", ""))

    async def who(self, request: Request) -> tuple[str, str]:
        """The caller's name and role: as the session guard found them for this request, else asked again."""
        known = request.scope.get(guard.WHO)
        if known is not None:
            name, role = known
            return str(name), str(role)
        found = await self.session(request)
        if found is None:
            raise SessionEnded("the API no longer takes this session")
        return found

    def page(self, request: Request, template: str, status_code: int = 200, *, who: tuple[str, str] = ("", ""),
             **ctx: Any) -> HTMLResponse:
        html = _env.get_template(template).render(base=request.scope.get("root_path", ""), user=who[0], role=who[1],
                                                  insecure=self.insecure, **ctx)
        return HTMLResponse(html, status_code=status_code, headers={"cache-control": "no-store"})

    def to_login(self, request: Request) -> Response:
        base = request.scope.get("root_path", "")
        if request.headers.get("hx-request"):
            # htmx follows a 303 inside the fragment; HX-Redirect makes the whole page go to the login.
            return Response(status_code=204, headers={"HX-Redirect": f"{base}/login"})
        return RedirectResponse(f"{base}/login", status_code=303)

    # -- login ----------------------------------------------------------------------------
    async def login_form(self, request: Request) -> Response:
        if await self.opens_without_login(request):
            # The API refuses every login there ("nothing needs a login"): the form would only loop back here.
            return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
        return self.page(request, "login.html", title="Log in", error="", username="")

    async def login(self, request: Request) -> Response:
        if await self.opens_without_login(request):
            return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
        form = await read_form(request)
        username, password = form.get("username", ""), form.get("password", "")
        # Not guarded: a refused login is this form's own answer (the API's sentence), not a redirect to itself.
        answer, resp = await self.call(request, "POST", "/api/v1/login", guarded=False,
                                       json={"username": username, "password": password, "session": True})
        if answer.error:
            return self.page(request, "login.html", status_code=answer.status, title="Log in",
                             error=answer.error, username=username)
        out = RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
        for value in resp.headers.get_list("set-cookie"):
            out.headers.append("set-cookie", value)
        return out

    async def logout(self, request: Request) -> Response:
        _, resp = await self.call(request, "POST", "/api/v1/logout", guarded=False)
        out = RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
        for value in resp.headers.get_list("set-cookie"):
            out.headers.append("set-cookie", value)
        # Cleared whatever the API said: a session already ended must still leave the browser logged out.
        out.delete_cookie(credentials.SESSION_COOKIE, path="/", httponly=True, secure=True, samesite="strict")
        return out

    # -- overview and its fragments ---------------------------------------------------------------
    async def _nodes(self, request: Request) -> ApiAnswer | dict[str, Any]:
        try:
            page = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            page = 1
        return await self._nodes_at(request, page)

    async def _nodes_at(self, request: Request, page: int) -> ApiAnswer | dict[str, Any]:
        # One page from the API, not the whole list cut here: with 1,000 nodes the list is 1.7 MB of JSON.
        answer, _ = await self.call(request, "GET", "/api/v1/nodes",
                                    params={"offset": (page - 1) * NODES_PER_PAGE, "limit": NODES_PER_PAGE})
        if answer.error:
            return answer
        total = int(answer.doc.get("total", 0))
        pages = max(1, -(-total // NODES_PER_PAGE))
        if page > pages:  # past the end (nodes went away, or a made-up number): the last page instead
            return await self._nodes_at(request, pages)
        return {"nodes": list(answer.doc.get("items", [])), "page": page, "pages": pages, "total": total}

    async def _models(self, request: Request) -> ApiAnswer | dict[str, Any]:
        answer, _ = await self.call(request, "GET", "/api/v1/models")
        return answer if answer.error else {"models": answer.doc.get("items", [])}

    async def _events(self, request: Request) -> ApiAnswer | dict[str, Any]:
        answer, _ = await self.call(request, "GET", "/api/v1/events",
                                    params={"since": time.time() - 3600, "limit": EVENTS_SHOWN})
        if answer.error:
            return answer
        return {"events": list(reversed(answer.doc.get("items", [])[-EVENTS_SHOWN:]))}

    async def _traffic(self, request: Request) -> ApiAnswer | dict[str, Any]:
        # The router's own counters over the API, two series only (``traffic``): never its objects.
        resp = await self.raw(request, "GET", "/metrics", params=traffic.QUERY)
        if not resp.is_success:
            return ApiAnswer(resp.status_code, {}, _message(resp))
        return {"report": self.traffic.add(traffic.parse(resp.text, at=time.monotonic()))}

    async def overview(self, request: Request) -> Response:
        # Together: each waits on the store's thread or a JSON build in a worker, not on the others.
        nodes, models, events, traffic_now, who = await asyncio.gather(
            self._nodes(request), self._models(request), self._events(request), self._traffic(request),
            self.who(request))
        parts = {"nodes": nodes, "models": models, "events": events, "traffic": traffic_now}
        ctx = {k: (p if isinstance(p, dict) else {"error": p.error}) for k, p in parts.items()}
        return self.page(request, "overview.html", title="Overview", who=who, **ctx)

    async def fragment(self, request: Request) -> Response:
        which = request.path_params["which"]
        get = {"nodes": self._nodes, "models": self._models, "events": self._events,
               "traffic": self._traffic}.get(which)
        if get is None:
            # Through the template's escaping: the name is the URL's, and a tag in it was sent back as HTML.
            return self.page(request, "_no_fragment.html", status_code=404, which=which[:40])
        part = await get(request)
        ctx = part if isinstance(part, dict) else {"error": part.error}
        return self.page(request, f"_{which}.html", **{which: ctx})


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


def create_ui(api: ASGIApp) -> ASGIApp:
    """The UI's ASGI app over the REST app ``api`` (what ``create_api`` returns); mount it at ``/ui``."""
    ui = Ui(api)
    # Imported here: the page modules import this one (for Ui), so a top-level import would be a cycle.
    from llmgw.control.ui import audit_page, keys_page, models_page, nodes_page, playground_page, users_page

    async def session_ended(request: Request, exc: Exception) -> Response:
        return ui.to_login(request)

    pages = Starlette(exception_handlers={SessionEnded: session_ended}, routes=[
        Route("/", ui.overview, methods=["GET"]),
        Route("/login", ui.login_form, methods=["GET"]),
        Route("/login", ui.login, methods=["POST"]),
        Route("/logout", ui.logout, methods=["POST"]),
        Route("/fragments/{which}", ui.fragment, methods=["GET"]),
        *keys_page.routes(ui),
        *models_page.routes(ui),
        *nodes_page.routes(ui),
        *playground_page.routes(ui),
        *audit_page.routes(ui),
        *users_page.routes(ui),
        Mount("/static", app=StaticFiles(directory=_HERE / "static"), name="static"),
    ])
    # The security headers outermost, so the bare-path redirect and the guard's own answers carry them too.
    return guard.SecurityHeaders(_Bare(guard.SessionGuard(pages, ui)))
