"""The provider's discovery document and signing keys, fetched over HTTP and cached.

The keys are fetched again when a token names a key id the cache lacks (the provider rotated its keys),
at most once per ``MIN_REFETCH_S``, so a flood of tokens with made-up key ids cannot make this server
flood the provider.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import httpx
import jwt

from llmgw.control.sso.refusals import SsoUnavailable

MIN_REFETCH_S = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Metadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    device_authorization_endpoint: str = ""
    revocation_endpoint: str = ""
    end_session_endpoint: str = ""
    userinfo_endpoint: str = ""


class Discovery:
    """``await d.metadata()`` and ``await d.key(kid)`` for one issuer."""

    def __init__(self, issuer: str, http: httpx.AsyncClient) -> None:
        self.issuer, self.http = issuer.rstrip("/"), http
        self._meta: Metadata | None = None
        self._keys: dict[str, Any] = {}
        self._keys_at = -MIN_REFETCH_S

    async def _get(self, url: str, what: str) -> dict[str, Any]:
        try:
            r = await self.http.get(url, timeout=10.0)
            r.raise_for_status()
            doc = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise SsoUnavailable(f"the identity provider's {what} ({url}) could not be read: {e}; check "
                                 "--sso-issuer and that the provider is up") from None
        if not isinstance(doc, dict):
            raise SsoUnavailable(f"the identity provider's {what} ({url}) is not a JSON object")
        return doc

    async def metadata(self) -> Metadata:
        if self._meta is None:
            doc = await self._get(f"{self.issuer}/.well-known/openid-configuration", "discovery document")
            if str(doc.get("issuer", "")).rstrip("/") != self.issuer:
                raise SsoUnavailable(f"the discovery document at {self.issuer} names issuer {doc.get('issuer')!r}: "
                                     "give its exact issuer URL as --sso-issuer")
            try:
                self._meta = Metadata(**{f.name: str(doc.get(f.name) or "") for f in dataclasses.fields(Metadata)})
            except TypeError as e:
                raise SsoUnavailable(f"the discovery document at {self.issuer} is incomplete: {e}") from None
            if not (self._meta.token_endpoint and self._meta.jwks_uri and self._meta.authorization_endpoint):
                raise SsoUnavailable(f"the discovery document at {self.issuer} lacks its authorization, token or "
                                     "jwks endpoint")
        return self._meta

    async def key(self, kid: str) -> Any | None:
        """The public key with this key id, fetching the key set again when it is unknown; None if still unknown."""
        if kid not in self._keys and time.monotonic() - self._keys_at >= MIN_REFETCH_S:
            meta = await self.metadata()
            doc = await self._get(meta.jwks_uri, "key set")
            self._keys_at = time.monotonic()
            keys: dict[str, Any] = {}
            for jwk in doc.get("keys") or []:
                if isinstance(jwk, dict) and jwk.get("use", "sig") == "sig":
                    try:
                        keys[str(jwk.get("kid", ""))] = jwt.PyJWK(jwk)
                    except jwt.PyJWTError:
                        continue  # a key type this server does not use
            self._keys = keys
        return self._keys.get(kid)
