"""Bootstrap tokens for `llmgw agent join`, kubeadm-style: ``[a-z0-9]{6}.[a-z0-9]{16}``.

The six-character id finds the row; only the sha256 of the sixteen-character secret is stored
(82 random bits: a slow hash like argon2 protects guessable passwords, not this), so a copied
database cannot join a node. Every refusal names the reason and the next step; the caller logs it
with the peer.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import re
import secrets
import string
import time

from llmgw.control.store import store as store_mod
from llmgw.core.errors import LlmgwError

ALPHABET = string.ascii_lowercase + string.digits
TOKEN_RE = re.compile(r"\A([a-z0-9]{6})\.([a-z0-9]{16})\Z")
#: Compared against when the id is unknown, so an unknown id costs the same work as a wrong secret.
_NO_SUCH_HASH = hashlib.sha256(b"no such token").hexdigest()


class Refused(enum.StrEnum):
    Malformed = "Malformed"  # not ID.SECRET
    Unknown = "Unknown"  # no such id, or the secret does not match it
    Expired = "Expired"
    UsedUp = "UsedUp"  # every use taken


class TokenRefused(LlmgwError):
    """A join token was refused; ``reason`` says which way."""

    def __init__(self, reason: Refused, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclasses.dataclass(frozen=True, slots=True)
class Granted:
    token_id: str
    node_name: str  # empty: the node keeps the id it asked for


def _random(n: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(n))


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(store: store_mod.Store, *, ttl_s: float, uses: int, node_name: str = "",
                 now: float | None = None) -> tuple[str, str]:
    """Stores a new token's hash; returns ``(token_id, secret)``, the token being ``f"{id}.{secret}"``."""
    if ttl_s <= 0:
        raise LlmgwError(f"--ttl {ttl_s:g}s: a token must live a while; give e.g. 1h")
    if uses < 1:
        raise LlmgwError(f"--uses {uses}: a token needs at least one use")
    now = time.time() if now is None else now
    for _ in range(5):  # 36**6 ids: a clash is rare, but a primary key clash would fail the command
        token_id = _random(6)
        if store.get_token(token_id) is None:
            break
    secret = _random(16)
    store.add_token(store_mod.StoredToken(token_id, _digest(secret), node_name, now + ttl_s, uses, now))
    return token_id, secret


def used_up(token_id: str) -> TokenRefused:
    return TokenRefused(Refused.UsedUp, f"join token {token_id}.… has been used as often as it may; make a new "
                                        "one with `llmgw token create`")


def check(store: store_mod.Store, token: str, *, now: float | None = None) -> Granted:
    """What ``token`` grants, or TokenRefused; takes no use. The secret is compared in constant time.

    A join checks first and spends the use (``Store.admit_node``) only once everything else passed: a
    5-use token had 1 left after 1 join and 3 refusals when every refusal spent one.
    """
    now = time.time() if now is None else now
    m = TOKEN_RE.match(token.strip())
    if m is None:
        raise TokenRefused(Refused.Malformed, "the join token is not of the form abcdef.0123456789abcdef; copy it "
                                              "whole from `llmgw token create`")
    token_id, secret = m.groups()
    row = store.get_token(token_id)
    matches = hmac.compare_digest(_digest(secret), row.sha256 if row else _NO_SUCH_HASH)
    if row is None or not matches:
        raise TokenRefused(Refused.Unknown, f"join token {token_id}.… is not known here; make one on the control "
                                            "plane with `llmgw token create`")
    if row.expires_at <= now:
        raise TokenRefused(Refused.Expired, f"join token {token_id}.… expired; make a new one with "
                                            "`llmgw token create`")
    if row.uses_left <= 0:
        raise used_up(token_id)
    return Granted(token_id, row.node_name)


def consume(store: store_mod.Store, token: str, *, now: float | None = None) -> Granted:
    """Takes one use of ``token`` or raises TokenRefused (``check``, then the use)."""
    now = time.time() if now is None else now
    granted = check(store, token, now=now)
    if not store.spend_token(granted.token_id, now=now):
        raise used_up(granted.token_id)
    return granted
