"""The CLI's client for the control plane's REST API; turns every failure into one clear sentence.

Its credential is, in order: ``LLMGW_TOKEN``, else the token of the context (``contexts``) that a
request to this URL uses: the one ``--context``/``LLMGW_CONTEXT`` names, else the current one when it
lists the URL, else one saved for the URL. Requests go to the URL asked for, then to the context's other
control planes in order when it does not answer (a standby forwards to the leader), so a cluster with
one control plane down still answers every command.
"""

from __future__ import annotations

import getpass
import os
import ssl
import sys
from pathlib import Path
from typing import Any

import httpx

from llmgw.cli import contexts, trust
from llmgw.core.errors import LlmgwError

DEFAULT_URL = contexts.DEFAULT_URL
#: Who runs the CLI, for the audit log; informational, never a credential.
ACTOR_HEADER = "X-Llmgw-Actor"
TOKEN_ENV = "LLMGW_TOKEN"
#: A CA certificate file (PEM) to verify an https:// server with when no context pinned one: for scripts that
#: give ``LLMGW_URL`` and ``LLMGW_TOKEN`` and have no saved context (the context's pinned CA wins).
CA_ENV = "LLMGW_CA_FILE"
#: An ``llmgw server --insecure`` marks every REST answer with this.
INSECURE_HEADER = "X-Llmgw-Insecure"


def unreachable(url: str) -> str:
    """What to tell a user whose control plane does not answer (``url``: one, or several joined by ", ")."""
    return (f"cannot reach the control plane at {url}: is `llmgw server` (or `make up`) running? "
            "Point at another with --url, LLMGW_URL or a context (`llmgw context list`).")


def default_url() -> str:
    """``LLMGW_URL``, else the first URL of the named or current context, else ``DEFAULT_URL``; never raises
    (an unknown context name is the request's error, said where the command reports errors)."""
    if os.environ.get("LLMGW_URL"):
        return os.environ["LLMGW_URL"]
    try:
        ctx = contexts.selected(contexts.read())
    except LlmgwError:
        return DEFAULT_URL
    return ctx.urls[0] if ctx is not None and ctx.urls else DEFAULT_URL


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
    return contexts.path_of(env)


def saved_token(url: str, *, path: Path | None = None) -> str:
    """The token of the context a request to ``url`` would use, or ""."""
    ctx = contexts.for_url(contexts.read(path), url)
    return ctx.token if ctx is not None else ""


def save_token(url: str, token: str, *, user: str, path: Path | None = None, current: bool = False) -> Path:
    """Saves (or with ``token`` "" forgets) the login for ``url``: the context named for it (``contexts.name_for``),
    made current with ``current`` (or when there is none yet). `llmgw up` keeps its admin's token so."""
    creds = contexts.read(path)
    name = contexts.name_for(url)
    ctx = creds.contexts.setdefault(name, contexts.Context(name, [contexts.normal(url)]))
    if contexts.normal(url) not in ctx.urls:
        ctx.urls.insert(0, contexts.normal(url))
    ctx.token, ctx.user = token, user if token else ""
    if token and (current or not creds.current):
        creds.current = name
    return contexts.write(creds, path)


def token_for(url: str) -> str:
    """``LLMGW_TOKEN``, else the saved token for ``url`` (its context's), else ""."""
    return os.environ.get(TOKEN_ENV, "").strip() or saved_token(url)


def env_ca() -> str:
    """The CA (PEM) ``LLMGW_CA_FILE`` names; "" when unset. LlmgwError saying what is wrong with the file."""
    path = os.environ.get(CA_ENV, "").strip()
    if not path:
        return ""
    try:
        pem = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise LlmgwError(f"{CA_ENV}={path}: cannot read it ({getattr(e, 'strerror', None) or e}); name the cluster "
                         "CA's certificate file (GET /api/v1/ca.crt, or DATA_DIR/pki/ca.crt on the server)") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise LlmgwError(f"{CA_ENV}={path}: not a PEM certificate; name the cluster CA's certificate file "
                         "(GET /api/v1/ca.crt, or DATA_DIR/pki/ca.crt on the server)")
    return pem


def verify_for(url: str) -> ssl.SSLContext | bool:
    """What a request to ``url`` verifies its server with: the CA its context pinned, else ``LLMGW_CA_FILE``'s,
    else the system's."""
    ctx = contexts.for_url(contexts.read(), url)
    return trust.verify(ctx.ca if ctx is not None and ctx.ca else env_ca())


class Client:
    def __init__(self, url: str, *, timeout: float = 30.0, token: str | None = None,
                 urls: list[str] | None = None, ca: str | None = None) -> None:
        """``urls``: the control planes to try, given (``login``, ``logout``), instead of a context's; ``ca``: the
        CA (PEM) to verify them with, given, instead of the one the context pinned ("": the system's)."""
        self.url = contexts.normal(url)
        #: Said at the first request, inside the caller's error handling (an unknown --context, a bad file).
        self._problem = ""
        self.context: contexts.Context | None = None
        if urls is None:
            try:
                self.context = contexts.for_url(contexts.read(), self.url)
            except LlmgwError as e:
                self._problem = str(e)
        #: Tried in order when one does not answer: the URL asked for, then its context's other control planes.
        self.urls = [self.url] + [u for u in (urls or (self.context.urls if self.context else [])) if u != self.url]
        env_token = os.environ.get(TOKEN_ENV, "").strip()
        self.token = token if token is not None else env_token or (self.context.token if self.context else "")
        headers = {ACTOR_HEADER: local_actor()}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        #: Every URL of the context is verified with the one CA pinned for it (``trust``).
        if ca is None:
            try:
                ca = self.context.ca if self.context is not None and self.context.ca else env_ca()
            except LlmgwError as e:
                self._problem, ca = self._problem or str(e), ""
        self.ca = ca
        self._http = httpx.Client(timeout=timeout, trust_env=False, headers=headers, verify=trust.verify(self.ca))
        self._warned = False

    def request(self, method: str, path: str, *, json: Any = None) -> tuple[int, Any]:
        if self._problem:
            raise LlmgwError(self._problem)
        resp = None
        for base in list(self.urls):
            try:
                resp = self._http.request(method, base + path, json=json)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if (failed := trust.cert_failure(e)) is not None:  # not down: not the server the context trusts
                    raise LlmgwError(trust.refusal(base, self.ca, failed,
                                                   context=self.context.name if self.context else "")) from None
                continue  # down: the next control plane of the context
            except httpx.HTTPError as e:
                raise LlmgwError(f"talking to the control plane at {base} failed: {e}") from None
            if base != self.url:
                print(f"note: the control plane at {self.url} did not answer; {base} did", file=sys.stderr)
                self.url = base  # the rest of this command goes where an answer came from
            break
        if resp is None:
            raise LlmgwError(unreachable(", ".join(self.urls)))
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
        if self.context is not None:
            return f"{said}. Run `llmgw login --context {self.context.name}`"
        return f"{said}. Run `llmgw login --url {self.url}`"

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def close(self) -> None:
        self._http.close()
