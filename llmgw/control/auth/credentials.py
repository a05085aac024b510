"""``Auth``: credentials in, principals out; logins, with their rate limit, and tokens made and forgotten.

A presented token is looked up by its id on the store's thread and compared by sha256; a
user's role is read with it, so a role change or a deletion counts from the next request.
Answers are cached for ``CACHE_S`` (a router's long poll and a UI's refreshes would otherwise
put two store reads on every request); a token deleted through this process is dropped from
the cache at once, and one deleted any other way stops working within ``CACHE_S``.

The in-process router needs no credential: it reads the control plane's table as an object
(``llmgw.router.watch.LocalWatcher``), not over HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import pathlib
import time
from collections.abc import Callable

from llmgw.control.auth import passwords, principals, tokens
from llmgw.control.auth.principals import Principal
from llmgw.control.store import settings as cluster_settings
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import StoredApiToken

log = logging.getLogger(__name__)
#: How long a looked-up token's answer is reused; a token deleted elsewhere works at most this long after.
CACHE_S = 0.5
#: A token made by ``llmgw login`` (kind "user") and a browser session (kind "session").
USER_TOKEN_S = 30 * 86400.0
SESSION_S = 12 * 3600.0
#: ``last_used_at`` is written at most this often per token (a write per request would cost more than the request).
TOUCH_EVERY_S = 60.0
SESSION_COOKIE = "llmgw_session"


class LoginRefused(Exception):
    """A login that failed; ``retry_after`` > 0 when it was refused by the rate limit (answered 429)."""

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.message, self.retry_after = message, retry_after


@dataclasses.dataclass(frozen=True, slots=True)
class LoggedIn:
    token: str = dataclasses.field(repr=False)
    user: str
    role: str
    expires_at: float


class Auth:
    """The REST API's authentication; ``Auth.insecure()`` lets everything through as ``principals.INSECURE``."""

    def __init__(self, db: StoreThread | None, *, insecure: bool = False, clock: Callable[[], float] = time.time,
                 limiter: passwords.Limiter | None = None, initial_password: pathlib.Path | None = None) -> None:
        if db is None and not insecure:
            raise ValueError("a secure Auth needs the store")
        self.db, self.is_insecure, self._clock = db, insecure, clock
        #: The file a server started without a terminal left admin's first password in (``datadir``); removed
        #: when admin's password changes.
        self.initial_password = initial_password
        self.limiter = limiter or passwords.Limiter()
        self._cache: dict[str, tuple[float, Principal | None]] = {}  # digest -> (looked up at, answer)
        self._touched: dict[str, float] = {}

    @classmethod
    def insecure(cls) -> Auth:
        """No authentication (``--insecure``, and in-process tests of other things)."""
        return cls(None, insecure=True)

    def forget_cached(self) -> None:
        """Drops every cached answer: called after this process deleted a token or changed a user."""
        self._cache.clear()

    async def principal(self, token: str) -> Principal | None:
        """The principal ``token`` proves, or None (malformed, unknown, expired, or its user gone)."""
        if self.is_insecure:
            return principals.INSECURE
        d = tokens.digest(token)
        now = self._clock()
        hit = self._cache.get(d)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        found = await self._look_up(token, d, now)
        if len(self._cache) > 10_000:  # bounded: a flood of made-up tokens must not grow it without end
            self._cache.clear()
        self._cache[d] = (now, found)
        return found

    async def _look_up(self, token: str, d: str, now: float) -> Principal | None:
        assert self.db is not None
        token_id = tokens.token_id(token)
        if token_id is None:
            return None
        row = await self.db.call(self.db.store.get_api_token, token_id)
        if row is None or not hmac.compare_digest(row.sha256, d) or (row.expires_at and row.expires_at <= now):
            return None
        if row.kind == "router":
            found = Principal("router", row.subject, principals.ROUTER, token_id)
        else:
            user = await self.db.call(self.db.store.get_user, row.subject)
            if user is None:
                return None
            found = Principal("user", user.name, user.role, token_id)
        if now - self._touched.get(token_id, 0.0) >= TOUCH_EVERY_S:
            self._touched[token_id] = now
            self.db.submit(self.db.store.touch_api_token, token_id, at=now)
        return found

    async def issue(self, *, kind: str, subject: str, ttl_s: float = 0.0, label: str = "") -> tuple[str, float]:
        """A new stored token ``(token, expires_at)`` (0: until deleted) for a user, a session or a router."""
        assert self.db is not None
        token_id, token = tokens.new_token()
        now = self._clock()
        expires_at = now + ttl_s if ttl_s else 0.0
        stored = StoredApiToken(id=token_id, sha256=tokens.digest(token), kind=kind, subject=subject,
                                created_at=now, expires_at=expires_at, label=label)
        await self.db.call(self.db.store.add_api_token, stored)
        return token, expires_at

    async def login(self, username: str, password: str, *, peer: str, session: bool) -> LoggedIn:
        """A token (or a session) for a user whose password matches; LoginRefused otherwise, never saying which
        of the name or the password was wrong."""
        assert self.db is not None
        lim, addr = self.limiter, passwords.address_key(peer)
        by_addr, by_pair, by_user = f"addr:{addr}", f"pair:{addr}|{username}", f"user:{username}"
        # This address's own failures refuse it; nobody else's do (see ``passwords``).
        wait = max(lim.retry_after(by_addr, limit=lim.address_limit), lim.retry_after(by_pair))
        if wait == 0 and lim.retry_after(by_user) > 0:
            if lim.failures(by_addr):  # the user's bucket is full and this address has guessed: refused
                wait = lim.retry_after(by_user)
            else:  # a clean address: slowed, never refused (the account's owner must still get in)
                await asyncio.sleep(lim.slow_s)
        if wait > 0:
            log.warning("login as %r from %s refused: too many failed logins (rate limited for %.0fs more)",
                        username, peer, wait)
            raise LoginRefused(f"too many failed logins from {peer}; try again from here in {wait:.0f}s (a login "
                               "from an address without failed logins is not refused), or ask an administrator: "
                               f"`llmgw user reset-password {username}`",
                               retry_after=wait)
        user = await self.db.call(self.db.store.get_user, username)
        policy = await self.db.call(cluster_settings.read, self.db.store)
        if policy.sso_required and username != policy.sso_break_glass:
            log.warning("password login as %r from %s refused: single sign-on is required", username, peer)
            raise LoginRefused("this cluster requires single sign-on: sign in with `llmgw login --sso` or the UI's "
                               "sign-in button (only the break-glass local user may log in with a password; an "
                               "admin changes that with `llmgw settings set sso_required false`)")
        # argon2 takes tens of milliseconds of CPU: on the loop it would hold every agent stream and request.
        ok = await asyncio.to_thread(passwords.verify, user.password_hash if user else None, password)
        if user is None or not ok:
            for k in (by_addr, by_pair, by_user):
                lim.fail(k)
            log.warning("failed login as %r from %s", username, peer)  # never the password
            raise LoginRefused("wrong username or password; an administrator can reset it with "
                               f"`llmgw user reset-password {username}`")
        kind, ttl = ("session", SESSION_S) if session else ("user", USER_TOKEN_S)
        token, expires_at = await self.issue(kind=kind, subject=user.name, ttl_s=ttl, label=f"login from {peer}")
        log.info("user %s logged in from %s (%s)", user.name, peer, kind)
        return LoggedIn(token, user.name, user.role, expires_at)

    async def revoke(self, token_id: str) -> bool:
        """Deletes one stored token (a logout)."""
        assert self.db is not None
        done = await self.db.call(self.db.store.delete_api_token, token_id)
        self.forget_cached()
        return done
