"""``SsoService``: single sign-on's flows, begun and finished, for the UI and the CLI.

- the UI (authorization code with PKCE): ``begin(redirect_uri)`` gives the provider's authorize URL (its
  state, nonce and PKCE verifier kept in the store, single use, ``pending_ttl_s``); the provider sends the
  browser back to ``redirect_uri`` with ``state`` and ``code``; ``finish(state, code, redirect_uri)`` takes
  the state (a second use is refused), exchanges the code with the verifier and the client secret, verifies
  the ID token (its nonce the one sent) and signs the user in.
- the CLI (device flow, brokered: the client secret stays here): ``device_start()`` gives the user code and
  a ``handle``; ``device_poll(handle)`` answers pending until the user approved on the provider's pages, then
  signs the user in as ``finish`` does.

Signing in (``signin.SignIn``) maps the ID token's groups to a role and projects, makes or updates the SSO
user and keeps its refresh token sealed; the answer is a llmgw token (a CLI's) or session (a browser's).
Every refusal is an ``SsoRefused`` with a sentence, and is written to the audit log with the peer's address.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import secrets
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx

from llmgw.control.auth.credentials import Auth
from llmgw.control.sso import audit
from llmgw.control.sso.config import SsoConfig
from llmgw.control.sso.discovery import Discovery
from llmgw.control.sso.provider import DEVICE_GRANT, ProviderClient, TokenAnswer
from llmgw.control.sso.refresher import Refresher
from llmgw.control.sso.refusals import SsoRefused, SsoUnavailable
from llmgw.control.sso.signin import SignedIn, SignIn
from llmgw.control.store.offloop import StoreThread

log = logging.getLogger(__name__)
CODE, DEVICE = "code", "device"
#: Sign-ins begun and not finished, at most: beginning needs no credential, so a flood must not grow the table
#: (or this server's calls to the provider) without end; each expires after ``pending_ttl_s`` anyway.
MAX_PENDING = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class Begun:
    """Where to send the browser, and the state it will come back with."""

    authorize_url: str
    state: str
    expires_in: float


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceStarted:
    handle: str = dataclasses.field(repr=False)
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: float
    interval: float


@dataclasses.dataclass(frozen=True, slots=True)
class DevicePending:
    """Not approved yet: poll again after ``interval`` seconds (longer after a ``slow_down``)."""

    interval: float
    status: str = "authorization_pending"


def _id(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class SsoService:
    """One per server; its HTTP client is closed by ``aclose``."""

    def __init__(self, cfg: SsoConfig, db: StoreThread, auth: Auth, *, http: httpx.AsyncClient | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.db, self.auth, self._clock = cfg, db, auth, clock
        self.http = http or httpx.AsyncClient(follow_redirects=False)
        self.discovery = Discovery(cfg.issuer, self.http)
        self.provider = ProviderClient(cfg, self.discovery, self.http)
        self.signin = SignIn(cfg, db, auth, self.discovery, clock=clock)
        self.refresher = Refresher(self.signin, self.provider, db, clock=clock)

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- the UI: authorization code with PKCE --------------------------------------------------------
    async def begin(self, redirect_uri: str) -> Begun:
        """The provider's authorize URL for a browser to be sent to; ``redirect_uri`` must be one registered
        for llmgw's client at the provider (the UI's callback)."""
        if not redirect_uri.startswith(("http://", "https://")):
            raise SsoRefused("sso_bad_redirect", f"redirect_uri {redirect_uri[:100]!r} is not an http(s) URL",
                             status=400)
        meta = await self.discovery.metadata()
        await self._room()
        state, nonce, verifier = secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(48)
        now = self._clock()
        await self.db.call(self.db.store.put_sso_pending, _id(state), kind=CODE,
                           data={"nonce": nonce, "verifier": verifier, "redirect_uri": redirect_uri},
                           expires_at=now + self.cfg.pending_ttl_s)
        query = urllib.parse.urlencode({
            "response_type": "code", "client_id": self.cfg.client_id, "redirect_uri": redirect_uri,
            "scope": " ".join(self.cfg.scopes), "state": state, "nonce": nonce,
            "code_challenge": _challenge(verifier), "code_challenge_method": "S256"})
        sep = "&" if "?" in meta.authorization_endpoint else "?"
        return Begun(f"{meta.authorization_endpoint}{sep}{query}", state, self.cfg.pending_ttl_s)

    async def finish(self, state: str, code: str, redirect_uri: str, *, session: bool = True,
                     peer: str = "") -> SignedIn:
        """Signs in the user the provider sent back with ``state`` and ``code``; SsoRefused (audited) otherwise."""
        try:
            data = await self.db.call(self.db.store.take_sso_pending, _id(state), kind=CODE, now=self._clock())
            if data is None:
                raise SsoRefused("sso_unknown_state", "this sign-in's state is unknown, was used already or has "
                                 f"expired (a sign-in must end within {self.cfg.pending_ttl_s:.0f}s, once): refused "
                                 "as a possible replay; start the sign-in again")
            if redirect_uri != data["redirect_uri"]:
                raise SsoRefused("sso_bad_redirect", "the redirect_uri is not the one this sign-in began with",
                                 status=400)
            answer = await self.provider.token({"grant_type": "authorization_code", "code": code,
                                                "redirect_uri": redirect_uri, "code_verifier": data["verifier"]})
            if answer.error:
                raise SsoRefused("sso_code_refused", f"the identity provider refused the sign-in's code "
                                 f"({answer.error}: {answer.description or 'no description'}); start the sign-in "
                                 "again")
        except SsoRefused as e:
            await audit.refused(self.db, e, peer=peer, action="sso login")
            raise
        return await self.sign_in_tokens(answer, nonce=data["nonce"], session=session, peer=peer)

    async def sign_in_tokens(self, answer: TokenAnswer, *, nonce: str | None, session: bool,
                             peer: str = "") -> SignedIn:
        """Signs in with the provider's token answer (its ID token verified, with ``nonce`` when not None);
        SsoRefused, audited, otherwise. ``finish`` and ``device_poll`` end here."""
        try:
            return await self.signin.sign_in(answer, nonce=nonce, session=session, peer=peer)
        except SsoRefused as e:
            await audit.refused(self.db, e, peer=peer, action="sso login")
            raise

    # -- the CLI: the device flow, brokered ----------------------------------------------------------
    async def _room(self) -> None:
        if await self.db.call(self.db.store.count_sso_pending, now=self._clock()) >= MAX_PENDING:
            raise SsoUnavailable(f"{MAX_PENDING} sign-ins are begun and not finished: try again in a few minutes "
                                 "(each expires unfinished)")

    async def device_start(self, *, peer: str = "") -> DeviceStarted:
        await self._room()
        doc = await self.provider.device_authorization()
        handle = secrets.token_urlsafe(32)
        expires_in = float(doc.get("expires_in") or self.cfg.pending_ttl_s)
        interval = float(doc.get("interval") or 5)
        data = {"device_code": str(doc["device_code"]), "interval": interval}
        await self.db.call(self.db.store.put_sso_pending, _id(handle), kind=DEVICE, data=data,
                           expires_at=self._clock() + expires_in)
        uri = str(doc.get("verification_uri") or doc.get("verification_url") or "")
        log.info("device sign-in begun from %s", peer or "unknown")
        return DeviceStarted(handle=handle, user_code=str(doc["user_code"]), verification_uri=uri,
                             verification_uri_complete=str(doc.get("verification_uri_complete") or uri),
                             expires_in=expires_in, interval=interval)

    async def device_poll(self, handle: str, *, peer: str = "") -> SignedIn | DevicePending:
        """Pending until the user approves on the provider's pages; then signed in (a CLI token). SsoRefused
        (audited) when denied, expired, unknown, or the token is refused."""
        try:
            now = self._clock()
            data = await self.db.call(self.db.store.get_sso_pending, _id(handle), kind=DEVICE, now=now)
            if data is None:
                raise SsoRefused("sso_unknown_state", "this device sign-in is unknown, finished already or has "
                                 "expired: run `llmgw login --sso` again")
            answer = await self.provider.token({"grant_type": DEVICE_GRANT, "device_code": data["device_code"]})
            if answer.error in ("authorization_pending", "slow_down"):
                return DevicePending(float(data.get("interval", 5)) + (5 if answer.error == "slow_down" else 0),
                                     answer.error)
            taken = await self.db.call(self.db.store.take_sso_pending, _id(handle), kind=DEVICE, now=now)
            if answer.error == "access_denied":
                raise SsoRefused("sso_denied", "the sign-in was refused on the identity provider's page")
            if answer.error == "expired_token":
                raise SsoRefused("sso_expired_code", "the user code expired before it was approved: run "
                                 "`llmgw login --sso` again")
            if answer.error:
                raise SsoRefused("sso_code_refused", f"the identity provider refused the device sign-in "
                                 f"({answer.error}: {answer.description or 'no description'})")
            if taken is None:  # another poll with this handle signed in first
                raise SsoRefused("sso_unknown_state", "this device sign-in finished already: refused as a replay")
        except SsoRefused as e:
            await audit.refused(self.db, e, peer=peer, action="sso login")
            raise
        # The device flow sends no nonce: the device code, held here only, binds the token to this sign-in.
        return await self.sign_in_tokens(answer, nonce=None, session=False, peer=peer)

    def describe(self) -> dict[str, Any]:
        """What the UI's login page shows: the provider's issuer (no secret)."""
        return {"enabled": True, "issuer": self.cfg.issuer, "client_id": self.cfg.client_id}
