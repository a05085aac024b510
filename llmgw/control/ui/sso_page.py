"""Sign in with SSO: the browser's half of the OpenID Connect authorization code flow with PKCE.

``GET /ui/sso/start`` asks the SSO service (``llmgw.control.sso``) for an authorization request for this
server's callback (``callbackurl``: the configured URL, or the request's host when it is one of the server's
names) and answers 303 to the provider; the service makes and keeps the state, the nonce and the PKCE
verifier (S256 challenge). The state is also put in a short cookie (``STATE_COOKIE``, HttpOnly,
``SameSite=Lax`` so the provider's redirect back carries it, path ``/ui/sso``, 10 minutes): a callback whose
state is not that browser's own is refused before the code is exchanged, so a callback URL made by someone
else (their code, their state) cannot sign this browser into their account (login CSRF).

``GET /ui/sso/callback?code&state`` hands both to the service's ``finish``, which checks the state (once), the
ID token (signature, issuer, audience, nonce, expiry), maps the claims to a role and issues an llmgw
session; the session cookie is then set exactly as a password login sets it (``login_page``'s, the REST
login's attributes), and the browser lands on the overview. A provider's ``?error=…`` and every refusal of
the service come back as the login page with the sentence (escaped by the template) and no session.

The landing is a tiny page that moves on to the overview by itself (``<meta http-equiv="refresh">``, no
script) rather than a 303: the session cookie is ``SameSite=Strict``, and a browser arriving from the
provider's site is on a cross-site navigation, redirects included, so a 303's next request would go
without the new cookie and show the login again; a navigation the page itself starts is same-site.
"""

from __future__ import annotations

import urllib.parse
from typing import Protocol

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.auth import credentials
from llmgw.control.ui.callbackurl import CallbackUrls, UnknownHost
from llmgw.control.ui.common import Ui

#: Holds the state of the sign-in this browser started; compared with the callback's.
STATE_COOKIE = "llmgw_sso_state"
STATE_COOKIE_S = 600
#: A state or code longer than this is no provider's: refused unread.
MAX_PARAM = 4096


class SsoRefusal(Protocol):
    """What the SSO service raises when it refuses a sign-in: a sentence saying what was wrong and what to do."""

    message: str


class SsoSignIn(Protocol):
    """What the UI needs of the SSO service; ``None`` in its place: SSO is not configured."""

    #: The provider's name for the button ("Sign in with NAME"); "" : "Sign in with SSO".
    display_name: str
    #: Password logins are for the break-glass local administrator only (the form is behind a link).
    required: bool

    async def begin(self, redirect_uri: str) -> str: ...

    async def finish(self, state: str, code: str, redirect_uri: str, *, peer: str) -> credentials.LoggedIn: ...


class Sso:
    """The SSO sign-in as the UI's pages see it: the service (or None), and how the callback URL is made."""

    def __init__(self, service: SsoSignIn | None, urls: CallbackUrls, refusals: tuple[type[Exception], ...]) -> None:
        self.service, self.urls, self.refusals = service, urls, refusals

    def button(self) -> str:
        """The sign-in button's words; "" when SSO is not configured (no button)."""
        if self.service is None:
            return ""
        return f"Sign in with {self.service.display_name or 'SSO'}"

    @property
    def required(self) -> bool:
        return self.service is not None and self.service.required


def _home(request: Request) -> str:
    return f"{request.scope.get('root_path', '')}/"


def _refused(ui: Ui, sso: Sso, request: Request, sentence: str, status: int) -> Response:
    """The login page with ``sentence`` and no session; the SSO button stays, to try again."""
    return ui.page(request, "login.html", status_code=status, title="Log in", error=sentence, username="",
                   sso_button=sso.button(), sso_required=sso.required, local=False)


def _callback_url(sso: Sso, request: Request) -> str:
    return sso.urls.for_request(scheme=request.url.scheme, host=request.headers.get("host", ""),
                                root_path=request.scope.get("root_path", ""))


async def start(ui: Ui, sso: Sso, request: Request) -> Response:
    if sso.service is None:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
    try:
        redirect_uri = _callback_url(sso, request)
    except UnknownHost as e:
        return _refused(ui, sso, request, str(e), 400)
    try:
        url = await sso.service.begin(redirect_uri)
    except sso.refusals as e:
        return _refused(ui, sso, request, _sentence(e), 502)
    state = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("state", [""])[0]
    out = RedirectResponse(url, status_code=303)
    out.set_cookie(STATE_COOKIE, state, max_age=STATE_COOKIE_S, path=f"{request.scope.get('root_path', '')}/sso",
                   httponly=True, secure=request.url.scheme == "https", samesite="lax")
    return out


def _sentence(e: Exception) -> str:
    return str(getattr(e, "message", "") or e) or "the sign-in was refused without a reason; try again"


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


async def callback(ui: Ui, sso: Sso, request: Request) -> Response:
    if sso.service is None:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
    params = {k: v for k, v in request.query_params.items()}
    if "error" in params:
        return _refused(ui, sso, request, provider_error(params), 400)
    state, code = params.get("state", ""), params.get("code", "")
    if not state or not code or len(state) > MAX_PARAM or len(code) > MAX_PARAM:
        return _refused(ui, sso, request, "this sign-in callback has no code or state (or one too long to be a "
                                          "provider's); start again with the sign-in button", 400)
    if request.cookies.get(STATE_COOKIE, "") != state:
        return _refused(ui, sso, request, "this sign-in was not started in this browser, or was started more than "
                                          f"{STATE_COOKIE_S // 60} minutes ago; start again with the sign-in "
                                          "button", 400)
    try:
        redirect_uri = _callback_url(sso, request)
    except UnknownHost as e:
        return _refused(ui, sso, request, str(e), 400)
    peer = request.client.host if request.client else "unknown"
    try:
        done = await sso.service.finish(state, code, redirect_uri, peer=peer)
    except sso.refusals as e:
        return _refused(ui, sso, request, _sentence(e), 403)
    out = ui.page(request, "signed_in.html", title="Signed in", home=_home(request), signed_in=done.user)
    # As ``/api/v1/login`` sets a session's (tests/integration/test_ui_sso.py compares the two).
    out.set_cookie(credentials.SESSION_COOKIE, done.token, max_age=int(credentials.SESSION_S), path="/",
                   httponly=True, secure=True, samesite="strict")
    return out


def routes(ui: Ui, sso: Sso) -> list[Route]:
    """The SSO routes below the UI's mount; open to a browser without a session (``guard.SessionGuard.OPEN``)."""
    async def start_route(request: Request) -> Response:
        return await start(ui, sso, request)

    async def callback_route(request: Request) -> Response:
        return await callback(ui, sso, request)

    return [Route("/sso/start", start_route, methods=["GET"]), Route("/sso/callback", callback_route, methods=["GET"])]
