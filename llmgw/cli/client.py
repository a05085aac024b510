"""The CLI's client for the control plane's REST API; turns every failure into one clear sentence."""

from __future__ import annotations

import getpass
import os
from typing import Any

import httpx

from llmgw.core.errors import LlmgwError

DEFAULT_URL = "http://127.0.0.1:8080"
#: Who runs the CLI, for the audit log; informational until authentication lands, never a credential.
ACTOR_HEADER = "X-Llmgw-Actor"


def unreachable(url: str) -> str:
    """What to tell a user whose control plane does not answer."""
    return (f"cannot reach the control plane at {url}: is `llmgw server` (or `make up`) running? "
            "Point at another with --url or LLMGW_URL.")


def default_url() -> str:
    return os.environ.get("LLMGW_URL", DEFAULT_URL)


def local_actor() -> str:
    """The local user for the audit log; under sudo, ``sudo:<the invoking user>`` rather than root."""
    if os.environ.get("SUDO_USER"):
        name = f"sudo:{os.environ['SUDO_USER']}"
    else:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid): the audit log keeps the address
            return ""
    # A header value must be printable ASCII; a stray byte would fail every request, not just the audit line.
    return "".join(ch for ch in name if ch.isascii() and ch.isprintable())


class Client:
    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False,
                                  headers={ACTOR_HEADER: local_actor()})

    def request(self, method: str, path: str, *, json: Any = None) -> tuple[int, Any]:
        try:
            resp = self._http.request(method, path, json=json)
        except httpx.ConnectError:
            raise LlmgwError(unreachable(self.url)) from None
        except httpx.HTTPError as e:
            raise LlmgwError(f"talking to the control plane at {self.url} failed: {e}") from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 400:
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
            raise LlmgwError(message or f"{method} {path} answered {resp.status_code}: {resp.text[:200]}")
        return resp.status_code, body

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def close(self) -> None:
        self._http.close()
