"""``/api/v1/sso``: single sign-on through the server's OpenID Connect provider (``control.sso``).

None of these needs a credential (they make one). The UI's flow: ``POST /api/v1/sso/begin`` gives the
provider's authorize URL; the provider sends the browser back to the UI's callback, which ``POST``s
``/api/v1/sso/finish`` (or calls ``SsoService.finish`` in process) for a session. The CLI's device flow:
``POST /api/v1/sso/device`` gives the user code, the page to enter it on and a ``handle``; ``POST
/api/v1/sso/device/token`` with the handle answers ``pending`` until the user approved, then a llmgw token.
Each sign-in and each refusal is written to the audit log by the service itself (with its reason), so these
routes are in ``audit.NOT_AUDITED``.
"""

from __future__ import annotations

import pydantic
from fastapi import APIRouter, Request, Response

from llmgw.control.auth import middleware as auth_mw
from llmgw.control.auth import principals
from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import ApiError, Forbidden, NotFound, Unavailable
from llmgw.control.http.login import signed_in
from llmgw.control.sso import DevicePending, SsoRefused, SsoService, SsoUnavailable
from llmgw.control.store import settings as cluster_settings


class SsoInfo(schemas.Body):
    enabled: bool
    issuer: str = ""
    #: ``sso_required`` (cluster setting): password logins only for the break-glass local user.
    required: bool = False


class BeginBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    redirect_uri: str = pydantic.Field(min_length=1, max_length=2000)


class BegunDoc(schemas.Body):
    authorize_url: str
    state: str
    expires_in: schemas.Number


class FinishBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    state: str = pydantic.Field(min_length=1, max_length=512)
    code: str = pydantic.Field(min_length=1, max_length=4096)
    redirect_uri: str = pydantic.Field(min_length=1, max_length=2000)
    session: bool = True


class SignedInDoc(schemas.Body):
    """A sign-in's answer; ``token`` only without ``session`` (a session's is in its cookie)."""

    token: str = pydantic.Field(default="", description="Only without session")
    user: str
    role: str
    expires_at: schemas.Number


class DeviceDoc(schemas.Body):
    handle: str = pydantic.Field(description="What the CLI polls /api/v1/sso/device/token with; a secret")
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: schemas.Number
    interval: schemas.Number


class DeviceTokenBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    handle: str = pydantic.Field(min_length=1, max_length=512)


class DeviceTokenDoc(schemas.Body):
    """``status`` is ``authorization_pending`` or ``slow_down`` (poll again after ``interval``) or ``approved``
    (with ``token``, ``user``, ``role``, ``expires_at``)."""

    status: str
    interval: schemas.Number = 0
    token: str = ""
    user: str = ""
    role: str = ""
    expires_at: schemas.Number = 0


def _peer(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _refusal(e: SsoRefused) -> ApiError:
    type_ = "authentication_error" if e.status == 401 else \
        "permission_error" if e.status == 403 else "invalid_request_error"
    return ApiError(e.status, e.message, code=e.code, type_=type_)


def router(sso: SsoService | None) -> APIRouter:
    r = APIRouter()

    def _service() -> SsoService:
        if sso is None:
            raise NotFound("single sign-on", "", "start the server with --sso-issuer, --sso-client-id and "
                           "--sso-client-secret-file (README, Single sign-on)", says="is not configured on this "
                           "server", code="sso_not_configured")
        return sso

    @r.get("/api/v1/sso", response_model=SsoInfo)
    async def info() -> dict[str, object]:
        """Whether this server signs users in through an identity provider, and which (the UI's button); whether
        it is required (the UI's login page then hides the password form behind a break-glass link)."""
        if sso is None:
            return {"enabled": False, "issuer": "", "required": False}
        policy = await sso.db.call(cluster_settings.read, sso.db.store)
        return {"enabled": True, "issuer": sso.cfg.issuer, "required": policy.sso_required}

    @r.post("/api/v1/sso/begin", response_model=BegunDoc)
    async def begin(body: BeginBody) -> dict[str, object]:
        """The provider's authorize URL for a browser (authorization code with PKCE) coming back to
        ``redirect_uri``; its state is single use and expires."""
        try:
            b = await _service().begin(body.redirect_uri)
        except SsoRefused as e:
            raise _refusal(e) from None
        except SsoUnavailable as e:
            raise Unavailable(str(e), code="sso_unavailable") from None
        return {"authorize_url": b.authorize_url, "state": b.state, "expires_in": b.expires_in}

    @r.post("/api/v1/sso/finish", response_model=SignedInDoc)
    async def finish(body: FinishBody, request: Request) -> Response:
        """Signs in the user the provider sent back with ``state`` and ``code``: a session cookie (``session``,
        the default) or a token."""
        if refusal := auth_mw.cross_site_login({k.lower(): v for k, v in request.headers.items()}):
            raise Forbidden.said(refusal, code="cross_site_login")
        try:
            done = await _service().finish(body.state, body.code, body.redirect_uri, session=body.session,
                                           peer=_peer(request))
        except SsoRefused as e:
            raise _refusal(e) from None
        except SsoUnavailable as e:
            raise Unavailable(str(e), code="sso_unavailable") from None
        request.scope[PRINCIPAL] = principals.Principal("user", done.user, done.role)
        return signed_in(request, done, session=done.session)

    @r.post("/api/v1/sso/device", response_model=DeviceDoc)
    async def device(request: Request) -> dict[str, object]:
        """Begins a device sign-in (``llmgw login --sso``): the code to enter on the provider's page."""
        try:
            d = await _service().device_start(peer=_peer(request))
        except SsoUnavailable as e:
            raise Unavailable(str(e), code="sso_unavailable") from None
        return {"handle": d.handle, "user_code": d.user_code, "verification_uri": d.verification_uri,
                "verification_uri_complete": d.verification_uri_complete, "expires_in": d.expires_in,
                "interval": d.interval}

    @r.post("/api/v1/sso/device/token", response_model=DeviceTokenDoc)
    async def device_token(body: DeviceTokenBody, request: Request) -> dict[str, object]:
        """``authorization_pending`` until the user approved the code, then ``approved`` with a llmgw token."""
        try:
            got = await _service().device_poll(body.handle, peer=_peer(request))
        except SsoRefused as e:
            raise _refusal(e) from None
        except SsoUnavailable as e:
            raise Unavailable(str(e), code="sso_unavailable") from None
        if isinstance(got, DevicePending):
            return {"status": got.status, "interval": got.interval}
        request.scope[PRINCIPAL] = principals.Principal("user", got.user, got.role)
        return {"status": "approved", "token": got.token, "user": got.user, "role": got.role,
                "expires_at": got.expires_at}

    return r
