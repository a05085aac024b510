"""Passwords: argon2id hashes, verified off the event loop, and failed logins rate-limited.

``Limiter`` counts failures per key (a username, a client address) in a sliding window;
past ``limit`` in ``window_s`` every attempt with that key is refused until the oldest
failure leaves the window, a correct password included, or guessing would go on at the
rate the refusals allow. In memory: a restart forgets it, which costs an attacker a
restart of the server they cannot cause.
"""

from __future__ import annotations

import collections
import functools
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


class Limiter:
    """Failures per key in a sliding window; ``retry_after`` says how long a key is still refused."""

    def __init__(self, *, limit: int = 5, window_s: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000) -> None:
        self.limit, self.window_s, self._clock, self._max_keys = limit, window_s, clock, max_keys
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

    def retry_after(self, key: str) -> float:
        """Seconds until ``key`` may try again; 0 when it may now."""
        q = self._recent(key)
        if len(q) < self.limit:
            return 0.0
        return max(0.0, q[-self.limit] + self.window_s - self._clock())

    def fail(self, key: str) -> None:
        if key not in self._failures and len(self._failures) >= self._max_keys:
            # Bounded: a stream of made-up usernames must not grow this without end. The oldest key goes.
            del self._failures[next(iter(self._failures))]
        self._failures.setdefault(key, collections.deque()).append(self._clock())
