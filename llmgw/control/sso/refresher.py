"""The refresher: every SSO user's refresh token used every ``--sso-refresh-interval``, on the leader.

A refresh the provider refuses (the user's session ended, the token revoked, the account gone) or whose new
ID token's groups map to no role or project any more ends the user's access here: every llmgw token and
session of theirs is deleted (``Store.sso_sign_out``), audited. A refresh that keeps access updates the role
and projects to what the groups map to now.

The bound: a user's access ends at most ``refresh_interval + tick + one pass`` after the change at the
provider, where ``tick`` (how often the leader looks for links due) is a quarter of the interval, 1 s to
30 s, and a pass is one token request per due user. While the provider cannot be reached (a network error or
a 5xx) access is kept and the refresh retried each tick: an outage is not proof of a removed user; the
warning in the log says since when.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from llmgw.control.sso import audit, seal
from llmgw.control.sso.provider import ProviderClient
from llmgw.control.sso.refusals import SsoRefused, SsoUnavailable
from llmgw.control.sso.signin import SignIn
from llmgw.control.store.base import Fenced
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.sso import StoredSsoLink

log = logging.getLogger(__name__)
ACTOR = "system:sso-refresh"


def tick_s(interval_s: float) -> float:
    return min(30.0, max(1.0, interval_s / 4))


@dataclasses.dataclass(slots=True)
class Pass:
    """What one pass did: users refreshed, users whose access it ended, users it could not reach the provider for."""

    refreshed: list[str] = dataclasses.field(default_factory=list)
    ended: list[str] = dataclasses.field(default_factory=list)
    unreachable: list[str] = dataclasses.field(default_factory=list)


class Refresher:
    def __init__(self, signin: SignIn, provider: ProviderClient, db: StoreThread, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.signin, self.provider, self.db, self._clock = signin, provider, db, clock
        self.cfg = signin.cfg

    async def _end(self, link: StoredSsoLink, why: str) -> None:
        n = await self.db.call(self.db.store.sso_sign_out, link.user)
        self.signin.auth.forget_cached()
        log.warning("sso user %s: access ended (%d token(s)): %s", link.user, n, why)
        await audit.record(self.db, actor=ACTOR, action="sso refresh", user=link.user, outcome="refused",
                           detail=f"{why}; {n} token(s) and session(s) ended")

    async def refresh_one(self, link: StoredSsoLink) -> str:
        """"refreshed", "ended" or "unreachable"."""
        token = seal.open_sealed(self.cfg.client_secret, link.refresh_token)
        if not token:
            await self._end(link, "sso_no_refresh_token: no refresh token to check the user's groups with (the "
                                  "provider gave none, or the client secret changed); the user signs in again")
            return "ended"
        try:
            answer = await self.provider.token({"grant_type": "refresh_token", "refresh_token": token})
            if answer.error:
                raise SsoRefused("sso_refresh_refused", f"the identity provider refused the refresh ({answer.error}: "
                                 f"{answer.description or 'no description'}): the user's session there ended or "
                                 "was revoked", user=link.user)
            if answer.id_token:
                claims = await self.signin.verify(answer.id_token, nonce=None)
            else:  # a provider that sends no new ID token on refresh: its userinfo says the groups now
                claims = await self.provider.userinfo(answer.access_token)
                if not claims:
                    raise SsoRefused("sso_refresh_refused", "the refresh gave neither an ID token nor userinfo",
                                     user=link.user)
            m = self.signin.map(claims)
            if m.subject != link.subject:
                raise SsoRefused("sso_subject_changed", "the refreshed token names another account", user=link.user)
            await self.signin.store(m, answer.refresh_token or token)
            return "refreshed"
        except SsoUnavailable as e:
            log.warning("sso user %s not refreshed (kept until the provider answers): %s", link.user, e)
            return "unreachable"
        except SsoRefused as e:
            await self._end(link, f"{e.code}: {e.message}")
            return "ended"

    async def run_pass(self) -> Pass:
        """Refreshes every link due; prunes expired pending sign-ins."""
        now = self._clock()
        done = Pass()
        await self.db.call(self.db.store.prune_sso_pending, now=now)
        for link in await self.db.call(self.db.store.list_sso_links):
            if now - link.refreshed_at < self.cfg.refresh_interval_s:
                continue
            outcome = await self.refresh_one(link)
            getattr(done, outcome).append(link.user)
        return done

    async def run(self, leading: Callable[[], bool]) -> None:
        """Forever: a pass each tick while this control plane leads."""
        every = tick_s(self.cfg.refresh_interval_s)
        while True:
            if leading():
                try:
                    await self.run_pass()
                except Fenced as e:
                    log.info("sso refresh pass stopped: %s", e)
                except Exception:  # noqa: BLE001  (one bad pass must not stop the refresher)
                    log.exception("sso refresh pass failed; retried in %.0fs", every)
            await asyncio.sleep(every)
