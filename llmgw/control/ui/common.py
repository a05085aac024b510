"""What every UI page shares: the in-process API client (``Ui``), the templates, and the form reader.

One source of truth: every page gets its data by calling the REST app in-process with the
browser's own credential (its ``cookie``, and its ``origin`` and ``host`` so the API's cross-site
check sees what the browser sent). No server-side admin token: a viewer's page shows exactly what a
viewer's API call shows, and an API refusal is what the page shows, in the API's words.

The page modules (``*_page.py``) import this one; ``app`` imports the pages and assembles them.
"""

from __future__ import annotations

import dataclasses
import http.cookiejar
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from llmgw.control.auth import middleware as auth_mw
from llmgw.control.ui import guard, traffic
from llmgw.core import humane

HERE = Path(__file__).parent

#: The pages' templates, with the filters they use (``bytes``, ``clock``) and ``pct``.
templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)


def _pct(used: float, total: float) -> int:
    return 0 if total <= 0 else max(0, min(100, round(100 * used / total)))


templates.filters["bytes"] = humane.size
templates.filters["duration"] = humane.duration
templates.filters["utc"] = humane.utc
templates.filters["iso"] = humane.iso
templates.globals["ago"] = humane.ago
templates.globals["now"] = time.time


def _when(at: object) -> Markup:
    """A time as people read it: relative (``3m ago``), the UTC time on hover, ISO 8601 for machines."""
    if not humane.iso(at):
        return Markup("-")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(humane.iso(at), humane.utc(at),
                                                                       humane.ago(at, time.time()))


templates.filters["when"] = _when
templates.globals["pct"] = _pct
templates.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))


@dataclasses.dataclass(frozen=True, slots=True)
class ApiAnswer:
    """One in-process API call's outcome: the JSON on success, or the API's error message in words."""

    status: int
    doc: dict[str, Any]
    error: str = ""


def api_message(resp: httpx.Response) -> str:
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
    """What a page handler is given: the in-process client to the REST app, and the page renderer."""

    def __init__(self, api: ASGIApp) -> None:
        # Through ``PeerFromUi``: the API sees the browser's address (the login limit, the audit log), not ours.
        # A jar that keeps nothing: the client is shared by every browser, and a session cookie the API sets on one
        # browser's login must reach that browser only, never ride along on the next caller's requests (each call
        # passes its own browser's cookie header).
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=guard.PeerFromUi(api)),
                                        base_url="http://ui.internal", timeout=30,
                                        cookies=http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(
                                            allowed_domains=[])))
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
                  browser_origin: bool = True, **kw: Any) -> httpx.Response:
        """The API's answer as it came (an NDJSON log, say); raises ``SessionEnded`` on a 401 unless not ``guarded``.

        ``browser_origin=False`` leaves the browser's ``Origin`` and ``Referer`` out: the SSO callback's, which
        the provider's site sent the browser to (``sso_page`` says what checks it instead)."""
        # The browser's own credential, origin and address, nothing of ours: the API decides as for the browser.
        passed = ("cookie", "origin", "referer", "host") if browser_origin else ("cookie", "host")
        headers = {k: v for k in passed if (v := request.headers.get(k))}
        if request.client is not None:
            headers[guard.PEER_HEADER] = request.client.host
        # Over the browser's scheme: the API sets the session cookie Secure when the browser came over HTTPS.
        url = path if request.url.scheme != "https" else "https://ui.internal" + path
        resp = await self.client.request(method, url, headers=headers, **kw)
        self.insecure = self.insecure or bool(resp.headers.get(auth_mw.INSECURE_HEADER))
        if guarded and resp.status_code == 401:
            raise SessionEnded(api_message(resp))
        return resp

    async def call(self, request: Request, method: str, path: str, *, guarded: bool = True,
                   browser_origin: bool = True, **kw: Any) -> tuple[ApiAnswer, httpx.Response]:
        """One JSON call as the browser; a 401 ends the page at the login (``SessionEnded``) unless not ``guarded``."""
        resp = await self.raw(request, method, path, guarded=guarded, browser_origin=browser_origin, **kw)
        if resp.is_success:
            return ApiAnswer(resp.status_code, resp.json()), resp
        return ApiAnswer(resp.status_code, {}, api_message(resp)), resp

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
        html = templates.get_template(template).render(base=request.scope.get("root_path", ""), user=who[0],
                                                       role=who[1], insecure=self.insecure,
                                                       query=request.query_params, **ctx)
        return HTMLResponse(html, status_code=status_code, headers={"cache-control": "no-store"})

    def to_login(self, request: Request) -> Response:
        base = request.scope.get("root_path", "")
        if request.headers.get("hx-request"):
            # htmx follows a 303 inside the fragment; HX-Redirect makes the whole page go to the login.
            return Response(status_code=204, headers={"HX-Redirect": f"{base}/login"})
        return RedirectResponse(f"{base}/login", status_code=303)
