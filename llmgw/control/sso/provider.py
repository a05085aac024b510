"""Calls to the provider's endpoints with the client's credentials: the token endpoint (a code, a device code,
a refresh token), the device authorization endpoint, userinfo. The client secret goes in the Authorization
header (client_secret_basic), never in a URL or a log line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from llmgw.control.sso.config import SsoConfig
from llmgw.control.sso.discovery import Discovery
from llmgw.control.sso.refusals import SsoUnavailable

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


@dataclasses.dataclass(frozen=True, slots=True)
class TokenAnswer:
    """The token endpoint's answer: tokens when ``error`` is "", else the OAuth error code and description."""

    id_token: str = dataclasses.field(default="", repr=False)
    refresh_token: str = dataclasses.field(default="", repr=False)
    access_token: str = dataclasses.field(default="", repr=False)
    error: str = ""
    description: str = ""


class ProviderClient:
    def __init__(self, cfg: SsoConfig, discovery: Discovery, http: httpx.AsyncClient) -> None:
        self.cfg, self.discovery, self.http = cfg, discovery, http

    def _auth(self) -> httpx.BasicAuth:
        return httpx.BasicAuth(self.cfg.client_id, self.cfg.client_secret)

    async def _post(self, url: str, data: dict[str, str], what: str) -> tuple[int, dict[str, Any]]:
        try:
            r = await self.http.post(url, data=data, auth=self._auth(), timeout=15.0)
            doc = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise SsoUnavailable(f"the identity provider's {what} ({url}) did not answer: {type(e).__name__}; check "
                                 "that it is up") from None
        if r.status_code >= 500 or not isinstance(doc, dict):
            raise SsoUnavailable(f"the identity provider's {what} ({url}) answered {r.status_code}")
        return r.status_code, doc

    async def token(self, data: dict[str, str]) -> TokenAnswer:
        meta = await self.discovery.metadata()
        status, doc = await self._post(meta.token_endpoint, data, "token endpoint")
        if status != 200:
            return TokenAnswer(error=str(doc.get("error") or f"http_{status}"),
                               description=str(doc.get("error_description") or "")[:200])
        return TokenAnswer(id_token=str(doc.get("id_token") or ""), refresh_token=str(doc.get("refresh_token") or ""),
                           access_token=str(doc.get("access_token") or ""))

    async def device_authorization(self) -> dict[str, Any]:
        meta = await self.discovery.metadata()
        if not meta.device_authorization_endpoint:
            raise SsoUnavailable(f"the identity provider {self.cfg.issuer} offers no device authorization endpoint: "
                                 "enable the device flow for llmgw's client there, or sign in through the UI")
        status, doc = await self._post(meta.device_authorization_endpoint, {"scope": " ".join(self.cfg.scopes)},
                                       "device authorization endpoint")
        if status != 200 or not doc.get("device_code") or not doc.get("user_code"):
            raise SsoUnavailable(f"the identity provider refused the device authorization: {doc.get('error')} "
                                 f"{str(doc.get('error_description') or '')[:200]}; check that llmgw's client may use "
                                 f"the grant {DEVICE_GRANT}")
        return doc

    async def userinfo(self, access_token: str) -> dict[str, Any]:
        meta = await self.discovery.metadata()
        if not meta.userinfo_endpoint or not access_token:
            return {}
        try:
            r = await self.http.get(meta.userinfo_endpoint, headers={"Authorization": f"Bearer {access_token}"},
                                    timeout=15.0)
            doc = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}
