"""Sign in with SSO: the browser's half of the OpenID Connect authorization code flow with PKCE.

As every page does, it goes through the REST API in-process (``/api/v1/sso``, ``llmgw.control.http.sso``, over
the SSO service ``llmgw.control.sso``): the UI keeps no secret and makes no token.

``GET /ui/sso/start`` asks ``POST /api/v1/sso/begin`` for an authorization request for this server's callback
(``callbackurl``: ``--sso-redirect-url``, or the request's own address when its host is one of the server's
names) and answers 303 to the provider; the service makes and keeps the state, the nonce and the PKCE
verifier (S256 challenge). The state is also put in a short cookie (``STATE_COOKIE``, HttpOnly,
``SameSite=Lax`` so the provider's redirect back carries it, path ``/ui/sso``, 10 minutes): a callback whose
state is not that browser's own is refused before the code is exchanged, so a callback URL made by someone
else (their code, their state) cannot sign this browser into their account (login CSRF).

``GET /ui/sso/callback?code&state`` hands both to ``POST /api/v1/sso/finish``, which takes the state (once),
exchanges the code, verifies the ID token (signature, issuer, audience, nonce, expiry), maps the claims to a
role and answers a session cookie: passed on to the browser as the password login's is (``login_page``). A
provider's ``?error=…`` and every refusal of the service come back as the login page with the sentence
(escaped by the template) and no session. The finish call carries no ``Origin``/``Referer`` of the browser:
the browser arrives from the provider's site, which the API's cross-site login check would refuse; the
state bound to this browser is what stands for that check here.

The landing is a tiny page that moves on to the overview by itself (``<meta http-equiv="refresh">``, no
script) rather than a 303: the session cookie is ``SameSite=Strict``, and a browser arriving from the
provider's site is on a cross-site navigation, redirects included, so a 303's next request would go
without the new cookie and show the login again (seen in Chromium); a navigation the page itself starts is
same-site.
"""

from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.ui.callbackurl import CallbackUrls, UnknownHost
from llmgw.control.ui.common import Ui

#: Holds the state of the sign-in this browser started; compared with the callback's.
STATE_COOKIE = "llmgw_sso_state"
STATE_COOKIE_S = 600
#: A state or code longer than this is no provider's: refused unread.
MAX_PARAM = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class SsoInfo:
    """What the login page shows of single sign-on, as ``GET /api/v1/sso`` says."""

    enabled: bool = False
    #: The provider's name for the button ("Sign in with NAME"); "" : "Sign in with SSO".
    name: str = ""
    #: Password logins are for the break-glass local administrator only (the form is behind a link).
    required: bool = False

    @property
    def button(self) -> str:
        """The sign-in button's words; "" when SSO is not configured (no button)."""
        return f"Sign in with {self.name or 'SSO'}" if self.enabled else ""


async def sso_info(ui: Ui, request: Request) -> SsoInfo:
    """Whether this server signs in through a provider (a server without the SSO API: no)."""
    answer, _ = await ui.call(request, "GET", "/api/v1/sso", guarded=False)
    if answer.error or not answer.doc.get("enabled"):
        return SsoInfo()
    return SsoInfo(enabled=True, name=str(answer.doc.get("name") or ""), required=bool(answer.doc.get("required")))


def _login(request: Request) -> Response:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)


async def _refused(ui: Ui, request: Request, sentence: str, status: int, info: SsoInfo | None = None) -> Response:
    """The login page with ``sentence`` and no session; the SSO button stays, to try again."""
    info = info or await sso_info(ui, request)
    return ui.page(request, "login.html", status_code=status, title="Log in", error=sentence, username="",
                   sso_button=info.button, sso_required=info.required, local=False)


def _callback_url(urls: CallbackUrls, request: Request) -> str:
    return urls.for_request(scheme=request.url.scheme, host=request.headers.get("host", ""),
                            root_path=request.scope.get("root_path", ""))


async def start(ui: Ui, urls: CallbackUrls, request: Request) -> Response:
    info = await sso_info(ui, request)
    if not info.enabled:
        return _login(request)
    try:
        redirect_uri = _callback_url(urls, request)
    except UnknownHost as e:
        return await _refused(ui, request, str(e), 400, info)
    answer, _ = await ui.call(request, "POST", "/api/v1/sso/begin", guarded=False,
                              json={"redirect_uri": redirect_uri})
    if answer.error:
        return await _refused(ui, request, answer.error, answer.status, info)
    out = RedirectResponse(str(answer.doc["authorize_url"]), status_code=303)
    out.set_cookie(STATE_COOKIE, str(answer.doc["state"]), max_age=STATE_COOKIE_S,
                   path=f"{request.scope.get('root_path', '')}/sso", httponly=True,
                   secure=request.url.scheme == "https", samesite="lax")
    return out


def provider_error(params: dict[str, str]) -> str:
    """The sentence for a provider's ``?error=…`` answer (RFC 6749 4.1.2.1), its description included."""
    code = params.get("error", "")[:200]
    said = params.get("error_description", "")[:500]
    if code == "access_denied":
        head = "the identity provider did not sign you in (access_denied: the sign-in or the consent was refused)"
    else:
        head = f"the identity provider refused the sign-in ({code})"
    return (f"{head}{f': {said}' if said else ''}; sign in with SSO again, or ask the provider's administrator "
            "whether your account may use this application")


async def callback(ui: Ui, urls: CallbackUrls, request: Request) -> Response:
    info = await sso_info(ui, request)
    if not info.enabled:
        return _login(request)
    params = dict(request.query_params.items())
    if "error" in params:
        return await _refused(ui, request, provider_error(params), 400, info)
    state, code = params.get("state", ""), params.get("code", "")
    if not state or not code or len(state) > MAX_PARAM or len(code) > MAX_PARAM:
        return await _refused(ui, request, "this sign-in callback has no code or state (or one too long to be a "
                                           "provider's); start again with the sign-in button", 400, info)
    if request.cookies.get(STATE_COOKIE, "") != state:
        return await _refused(ui, request, "this sign-in was not started in this browser, or was started more "
                                           f"than {STATE_COOKIE_S // 60} minutes ago; start again with the "
                                           "sign-in button", 400, info)
    try:
        redirect_uri = _callback_url(urls, request)
    except UnknownHost as e:
        return await _refused(ui, request, str(e), 400, info)
    # Without the browser's Origin/Referer: it comes from the provider's site (see the module's text).
    answer, resp = await ui.call(request, "POST", "/api/v1/sso/finish", guarded=False, browser_origin=False,
                                 json={"state": state, "code": code, "redirect_uri": redirect_uri,
                                       "session": True})
    if answer.error:
        return await _refused(ui, request, answer.error, answer.status, info)
    home = f"{request.scope.get('root_path', '')}/"
    out = ui.page(request, "signed_in.html", title="Signed in", home=home, signed_in=str(answer.doc.get("user", "")))
    # The API's session cookie as it set it, as the password login passes its own on.
    for value in resp.headers.get_list("set-cookie"):
        out.headers.append("set-cookie", value)
    return out


def routes(ui: Ui, urls: CallbackUrls) -> list[Route]:
    """The SSO routes below the UI's mount; open to a browser without a session (``guard.SessionGuard.OPEN``)."""
    async def start_route(request: Request) -> Response:
        return await start(ui, urls, request)

    async def callback_route(request: Request) -> Response:
        return await callback(ui, urls, request)

    return [Route("/sso/start", start_route, methods=["GET"]), Route("/sso/callback", callback_route, methods=["GET"])]
