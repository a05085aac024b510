"""From a verified ID token to a signed-in llmgw user: the claims mapped, the user made or updated, a token.

The user's name is the ``--sso-username-claim`` claim (``preferred_username``; ``sub`` when absent), which
must be a valid llmgw user name and must not be a local user's (an identity provider account named ``admin``
does not become the local admin). The groups (``--sso-groups-claim``) give the cluster role (the strongest
mapped) and the project memberships; a user whose groups map to nothing is refused. A user with projects but
no mapped role gets ``viewer``, the least role a project member needs to reach the API.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any

from llmgw.control.auth import credentials, principals
from llmgw.control.auth.credentials import Auth
from llmgw.control.sso import audit, idtoken, seal
from llmgw.control.sso.config import SsoConfig
from llmgw.control.sso.discovery import Discovery
from llmgw.control.sso.provider import TokenAnswer
from llmgw.control.sso.refusals import SsoRefused
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.sso import SsoNameTaken

log = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,62}")


@dataclasses.dataclass(frozen=True, slots=True)
class SignedIn:
    """A signed-in SSO user and its llmgw credential (a CLI token, or a browser session's cookie value)."""

    user: str
    role: str
    token: str = dataclasses.field(repr=False)
    expires_at: float
    session: bool
    projects: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Mapped:
    user: str
    subject: str
    role: str
    projects: dict[str, str]
    groups: tuple[str, ...]


class SignIn:
    def __init__(self, cfg: SsoConfig, db: StoreThread, auth: Auth, discovery: Discovery, *,
                 clock: Callable[[], float]) -> None:
        self.cfg, self.db, self.auth, self.discovery, self._clock = cfg, db, auth, discovery, clock

    async def verify(self, id_token: str, *, nonce: str | None) -> dict[str, Any]:
        if not id_token:
            raise SsoRefused("sso_no_id_token", "the identity provider answered no ID token: llmgw's client must "
                             "ask for the openid scope (--sso-scopes)")
        return await idtoken.verify(id_token, discovery=self.discovery, client_id=self.cfg.client_id, nonce=nonce,
                                    leeway_s=self.cfg.leeway_s)

    def map(self, claims: dict[str, Any]) -> Mapped:
        """The user, role and projects the claims give; SsoRefused (403) when they give none."""
        sub = str(claims.get("sub", ""))
        name = str(claims.get(self.cfg.username_claim) or sub)
        if not _NAME.fullmatch(name):
            raise SsoRefused("sso_bad_username", f"the ID token's {self.cfg.username_claim!r} ({name[:80]!r}) is not "
                             "a valid llmgw user name (1 to 63 of letters, digits, '.', '_', '@' and '-'): choose "
                             "another claim with --sso-username-claim", status=403)
        raw = claims.get(self.cfg.groups_claim, [])
        groups = tuple(sorted(str(g) for g in raw)) if isinstance(raw, list) else ((str(raw),) if raw else ())
        role = self.cfg.mapping.role_of(groups)
        projects = self.cfg.mapping.projects_of(groups)
        if not role and not projects:
            shown = ", ".join(groups[:20]) or "none"
            raise SsoRefused("sso_unmapped", f"{name}'s groups at the identity provider ({shown}, from the "
                             f"{self.cfg.groups_claim!r} claim) map to no llmgw role or project: an administrator "
                             "maps a group with --sso-role-map GROUP=ROLE or --sso-project-map GROUP=PROJECT:ROLE",
                             user=name, status=403)
        return Mapped(name, f"{self.discovery.issuer}|{sub}", role or principals.VIEWER, projects, groups)

    async def store(self, m: Mapped, refresh_token: str) -> None:
        """The user made or updated with its role, projects and sealed refresh token."""
        try:
            missing = await self.db.call(self.db.store.sso_sign_in, user=m.user, role=m.role, projects=m.projects,
                                         subject=m.subject, refresh_token=seal.seal(self.cfg.client_secret,
                                                                                    refresh_token),
                                         groups=m.groups, now=self._clock())
        except SsoNameTaken as e:
            raise SsoRefused("sso_name_taken", f"{e}: single sign-on does not take over another account; an "
                             "administrator renames or deletes the local user, or sets --sso-username-claim",
                             user=m.user, status=403) from None
        if missing:
            log.warning("sso user %s: mapped projects %s do not exist (`llmgw project create`); left out",
                        m.user, ", ".join(missing))
        self.auth.forget_cached()  # a role changed here counts from the next request

    async def sign_in(self, answer: TokenAnswer, *, nonce: str | None, session: bool, peer: str) -> SignedIn:
        claims = await self.verify(answer.id_token, nonce=nonce)
        m = self.map(claims)
        await self.store(m, answer.refresh_token)
        kind, ttl = ("session", credentials.SESSION_S) if session else ("user", credentials.USER_TOKEN_S)
        if not answer.refresh_token:  # nothing to refresh with: the credential lasts one refresh interval
            ttl = min(ttl, self.cfg.refresh_interval_s)
        token, expires_at = await self.auth.issue(kind=kind, subject=m.user, ttl_s=ttl,
                                                  label=f"sso login from {peer or 'unknown'}"[:120])
        log.info("user %s signed in through sso from %s (role %s, %s)", m.user, peer or "unknown", m.role, kind)
        await audit.record(self.db, actor=f"user:{m.user} (sso@{peer or 'unknown'})", action="sso login",
                           user=m.user, outcome="ok", detail=f"role {m.role}; groups {', '.join(m.groups)}"[:400])
        return SignedIn(m.user, m.role, token, expires_at, session, m.projects)
