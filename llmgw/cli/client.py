"""The CLI's client for the control plane's REST API; turns every failure into one clear sentence.

Its credential is, in order: ``LLMGW_TOKEN``, else the token ``llmgw login`` saved for this URL in
``$XDG_CONFIG_HOME/llmgw/credentials.json`` (directory 0700, file 0600). The file is replaced whole
(a new file made with O_EXCL, then renamed over the old one), so a crash mid-write never leaves half
a file, and a file or link planted at the temporary name is refused rather than written through.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx

from llmgw.core.errors import LlmgwError

DEFAULT_URL = "http://127.0.0.1:8080"
#: Who runs the CLI, for the audit log; informational, never a credential.
ACTOR_HEADER = "X-Llmgw-Actor"
TOKEN_ENV = "LLMGW_TOKEN"
#: An ``llmgw server --insecure`` marks every REST answer with this.
INSECURE_HEADER = "X-Llmgw-Insecure"


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


def credentials_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw" / "credentials.json"


def _normal(url: str) -> str:
    return url.rstrip("/")


def _read_credentials(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise LlmgwError(f"cannot read {path}: {e}; move it aside and run `llmgw login` again") from None
    return doc if isinstance(doc, dict) else {}


def saved_token(url: str, *, path: Path | None = None) -> str:
    """The token ``llmgw login`` saved for ``url``, or ""."""
    entry = _read_credentials(path or credentials_path()).get(_normal(url))
    token = entry.get("token") if isinstance(entry, dict) else None
    return token if isinstance(token, str) else ""


def save_token(url: str, token: str, *, user: str, path: Path | None = None) -> Path:
    """Saves (or with ``token`` "" removes) the token for ``url``; the file stays 0600 in a 0700 directory."""
    path = path or credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    doc = _read_credentials(path)
    if token:
        doc[_normal(url)] = {"token": token, "user": user}
    else:
        doc.pop(_normal(url), None)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def token_for(url: str) -> str:
    """``LLMGW_TOKEN``, else the saved token for ``url``, else ""."""
    return os.environ.get(TOKEN_ENV, "").strip() or saved_token(url)


class Client:
    def __init__(self, url: str, *, timeout: float = 30.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {ACTOR_HEADER: local_actor()}
        self.token = token_for(self.url) if token is None else token
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False, headers=headers)
        self._warned = False

    def request(self, method: str, path: str, *, json: Any = None) -> tuple[int, Any]:
        try:
            resp = self._http.request(method, path, json=json)
        except httpx.ConnectError:
            raise LlmgwError(unreachable(self.url)) from None
        except httpx.HTTPError as e:
            raise LlmgwError(f"talking to the control plane at {self.url} failed: {e}") from None
        if resp.headers.get(INSECURE_HEADER) == "1" and not self._warned:
            self._warned = True
            print(f"warning: the control plane at {self.url} runs with --insecure: no authentication, anyone on "
                  "its machine can change the cluster (loopback development only)", file=sys.stderr)
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 400:
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
            if resp.status_code == 401:
                raise LlmgwError(self._unauthenticated(message))
            raise LlmgwError(message or f"{method} {path} answered {resp.status_code}: {resp.text[:200]}")
        return resp.status_code, body

    def _unauthenticated(self, message: str | None) -> str:
        said = f"the control plane at {self.url} refused the request: {message or 'no valid credential'}"
        if os.environ.get(TOKEN_ENV, "").strip():
            return f"{said}. The token is from {TOKEN_ENV}: set a valid one, or unset it to use `llmgw login`'s"
        return f"{said}. Run `llmgw login --url {self.url}`"

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def close(self) -> None:
        self._http.close()
