"""Passwords: argon2id hashes, verified off the event loop, and failed logins rate-limited.

``Limiter`` counts failures per key in a sliding window; past ``limit`` in ``window_s`` a key is
refused until the oldest failure leaves the window. ``Auth.login`` keeps three kinds of key, so that
failures from one address never lock a correct password out from another (six wrong logins with made-up
names, each counted as 127.0.0.1 through the admin UI and per user as well, made the administrator's own
login answer 429 from everywhere):

- per address (``addr:``), a larger allowance: an address that guesses many names is refused, itself;
- per address and user (``pair:``): an address that guesses one user's password is refused, itself;
- per user (``user:``), over all addresses: guessing one account from many addresses. It only *slows*
  a login from an address with no failures of its own (``slow_s``), never refuses it; an address that
  has failed is refused while the user's bucket is full. So a botnet gets one guess per address per
  window, and the owner, from an address that never failed, still logs in.

In memory: a restart forgets it, which costs an attacker a restart of the server they cannot cause.
"""

from __future__ import annotations

import collections
import functools
import ipaddress
import secrets
import time
from collections.abc import Callable

import argon2

_HASHER = argon2.PasswordHasher()


@functools.cache
def _dummy() -> str:
    """Verified when the user does not exist, so an unknown name takes as long as a wrong password
    (without it, the answer's time told which usernames exist). Made on first use, not at import."""
    return _HASHER.hash(secrets.token_urlsafe(18))


def new_password() -> str:
    return secrets.token_urlsafe(18)


def hash_password(password: str) -> str:
    """argon2id; slow on purpose (tens of ms): call it off the event loop."""
    return _HASHER.hash(password)


def verify(password_hash: str | None, password: str) -> bool:
    """Whether ``password`` matches; None (no such user) verifies against a dummy and is False."""
    try:
        return _HASHER.verify(password_hash or _dummy(), password) and password_hash is not None
    except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
        return False


def address_key(peer: str) -> str:
    """The unit an address limit counts: an IPv4 address, or an IPv6 address's /64 (one host's allocation:
    a client that owns a /64 would otherwise get a fresh allowance per address it picks)."""
    try:
        ip = ipaddress.ip_address(peer)
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Limiter:
    """Failures per key in a sliding window; ``retry_after`` says how long a key is still refused.

    ``limit`` is per key unless ``retry_after`` is given another; ``address_limit`` is what ``Auth.login`` gives
    an address's own key (a shared address, an office behind NAT, makes more honest mistakes than one user);
    ``slow_s`` is how long a login from a clean address waits while its user's bucket is full.
    """

    def __init__(self, *, limit: int = 5, address_limit: int = 20, window_s: float = 300.0, slow_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.limit, self.address_limit, self.window_s, self.slow_s = limit, address_limit, window_s, slow_s
        self._clock, self._max_keys = clock, max_keys
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, key: str) -> collections.deque[float]:
        q = self._failures.get(key)
        if q is None:
            return collections.deque()
        cutoff = self._clock() - self.window_s
        while q and q[0] <= cutoff:
            q.popleft()
        if not q:
            del self._failures[key]
        return q

    def retry_after(self, key: str, *, limit: int = 0) -> float:
        """Seconds until ``key`` may try again (past ``limit``, the default ``self.limit``); 0 when it may now."""
        limit = limit or self.limit
        q = self._recent(key)
        if len(q) < limit:
            return 0.0
        return max(0.0, q[-limit] + self.window_s - self._clock())

    def failures(self, key: str) -> int:
        """How many failures ``key`` has in the window now."""
        return len(self._recent(key))

    def fail(self, key: str) -> None:
        if key not in self._failures and len(self._failures) >= self._max_keys:
            # Bounded: a stream of made-up usernames must not grow this without end. The oldest key goes.
            del self._failures[next(iter(self._failures))]
        self._failures.setdefault(key, collections.deque()).append(self._clock())
