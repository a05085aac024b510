"""Refresh tokens sealed at rest: AES-GCM under a key derived (HKDF-SHA256) from the client secret.

A refresh token is useless without the client secret anyway; sealed with a key derived from it, the
database alone (a backup, a replica) gives neither. Every control plane of a cluster reads the same
secret file, so each opens what another sealed. A new client secret makes the old seals unreadable: those
users sign in again (their refresh fails as a refused one would).
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_INFO = b"llmgw sso refresh token v1"
_PREFIX = "v1."


def _key(client_secret: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(client_secret.encode())


def seal(client_secret: str, token: str) -> str:
    """``v1.<base64 nonce+ciphertext>``; "" for no token."""
    if not token:
        return ""
    nonce = os.urandom(12)
    return _PREFIX + base64.urlsafe_b64encode(nonce + AESGCM(_key(client_secret)).encrypt(nonce, token.encode(),
                                                                                          None)).decode()


def open_sealed(client_secret: str, sealed: str) -> str:
    """The token, or "" when there is none or it does not open (another secret sealed it)."""
    if not sealed.startswith(_PREFIX):
        return ""
    try:
        raw = base64.urlsafe_b64decode(sealed[len(_PREFIX):])
        return AESGCM(_key(client_secret)).decrypt(raw[:12], raw[12:], None).decode()
    except (ValueError, InvalidTag):
        return ""
