"""REST credentials: ``llmgw_<id>_<secret>``, of which the store keeps the id and the sha256, never the secret.

The id (12 of ``[a-z0-9]``) finds the row in one lookup; the secret (32 of the same, ~165 bits) is
what proves it. sha256, not argon2: there is nothing to brute-force in 165 random bits, and argon2
on every request would cost tens of milliseconds each.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string

PREFIX = "llmgw_"
_ALPHABET = string.ascii_lowercase + string.digits
_FORMAT = re.compile(r"llmgw_([a-z0-9]{12})_([a-z0-9]{32})")


def _random(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def new_token() -> tuple[str, str]:
    """``(id, token)``: the id is stored and shown in listings; the token is shown once."""
    token_id = _random(12)
    return token_id, f"{PREFIX}{token_id}_{_random(32)}"


def token_id(token: str) -> str | None:
    """The id of a well-formed token, else None (anything else is refused without a store lookup)."""
    m = _FORMAT.fullmatch(token)
    return m.group(1) if m else None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
