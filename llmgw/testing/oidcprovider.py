"""A real OpenID Connect provider on loopback for the single sign-on tests: the certified ``oidc-provider``
npm package (``tests/oidc/``, installed by ``make test-deps``'s ``npm ci``), never a mock.

``OidcProvider(tmp)`` writes the provider's configuration (issuer ``http://127.0.0.1:PORT``, one confidential
client for llmgw, an RSA signing key the test also holds, the accounts file) and starts ``node
tests/oidc/provider.mjs`` on a free port; it is ready when its discovery document answers, and stopped by
its pid (its own process group) even when the test fails.

The accounts file is read on every lookup: ``set_groups("alice", [])`` shows at alice's next refresh.
``revoke("alice")`` ends every grant of alice's at the provider (her refresh tokens stop working).
``sign(claims)`` signs an ID token with the provider's own key, for the tests that a token with a right
signature but a wrong issuer, audience or expiry is refused on its claims.
"""

from __future__ import annotations

import html.parser
import json
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from llmgw.testing import procs

#: The harness as committed (tests/oidc), and where `make oidc-provider` copies it and installs its packages
#: (test-artifacts/oidc, gitignored), so that tests/ holds only this repository's own files.
SOURCE = Path(__file__).resolve().parents[2] / "tests" / "oidc"
HARNESS = Path(__file__).resolve().parents[2] / "test-artifacts" / "oidc"
CLIENT_ID = "llmgw"
KID = "llmgw-test-key"
#: The UI's callback path the client registration allows (the UI engineer's route).
UI_CALLBACK = "/ui/sso/callback"


class ProviderMissing(RuntimeError):
    """node or the harness's node_modules are missing; the message says how to install them."""


def node() -> list[str]:
    """The argv that runs node: Debian 12's node 18 needs WebCrypto made global (later ones have it)."""
    found = shutil.which("node")
    if not found:
        raise ProviderMissing("node is not installed: `make test-deps` installs Debian's nodejs and npm (or "
                              "`apt-get install nodejs npm`)")
    if not (HARNESS / "node_modules" / "oidc-provider").is_dir():
        raise ProviderMissing(f"the test provider's packages are missing in {HARNESS}: run `make oidc-provider` "
                              f"(it copies {SOURCE} there and runs `npm ci`)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    major = int(version.lstrip("v").split(".")[0] or 0) if version.lstrip("v")[:1].isdigit() else 0
    if major < 18:
        raise ProviderMissing(f"node {version or '(unknown version)'} is too old for the test provider: it needs "
                              "node 18 or newer (Debian 12's nodejs)")
    return [found, "--experimental-global-webcrypto"] if major == 18 else [found]


def _private_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    doc = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    return {**doc, "kid": kid, "use": "sig", "alg": "RS256"}


class OidcProvider:
    """``with OidcProvider(tmp, redirect_uris=[...]) as idp: idp.issuer, idp.secret_file, ...``."""

    def __init__(self, directory: Path, *, redirect_uris: list[str] | None = None,
                 accounts: dict[str, dict[str, Any]] | None = None, port: int = 0, kid: str = KID) -> None:
        """``port`` and ``kid``: another provider at the same issuer with a new key (a key rotation)."""
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or procs.free_port()
        self.kid = kid
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.client_id = CLIENT_ID
        self.client_secret = secrets.token_urlsafe(32)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.accounts_file = self.dir / "accounts.json"
        self.set_accounts(accounts if accounts is not None else {
            "alice": {"groups": ["llmgw-admins"]}, "bob": {"groups": ["llmgw-viewers"]}, "carol": {"groups": []}})
        self.secret_file = self.dir / "client-secret"
        self.secret_file.touch(mode=0o600)
        self.secret_file.write_text(self.client_secret + "\n")
        #: Loopback URIs match on any port (the client is "native"): ``http://127.0.0.1/PATH`` is enough.
        self.redirect_uris = redirect_uris or [f"http://127.0.0.1{UI_CALLBACK}"]
        self.proc: procs.Proc | None = None

    # -- the accounts (read by the provider on every lookup) ------------------------------------------
    def set_accounts(self, accounts: dict[str, dict[str, Any]]) -> None:
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(accounts))
        tmp.replace(self.accounts_file)  # whole: the provider never reads half a file

    def accounts(self) -> dict[str, dict[str, Any]]:
        return dict(json.loads(self.accounts_file.read_text()))

    def set_groups(self, account: str, groups: list[str]) -> None:
        now = self.accounts()
        now[account] = {**now.get(account, {}), "groups": list(groups)}
        self.set_accounts(now)

    def revoke(self, account: str) -> int:
        """Ends every grant of ``account`` at the provider; how many there were."""
        r = httpx.post(f"{self.issuer}/_harness/revoke", json={"account": account}, timeout=10)
        r.raise_for_status()
        return int(r.json()["ended"])

    # -- the provider's own pages, as a person's browser would post them ---------------------------------
    def approve(self, url: str, account: str, *, password: str = "pw", abort: bool = False) -> str:
        """Follows the provider's pages from ``url`` (a device flow's ``verification_uri_complete`` or an
        authorization URL) as a browser would: each page's form posted (hidden fields kept; the login page's
        name and password filled; consent given, or with ``abort`` refused), redirects followed while they stay
        on the provider. Returns the URL it ended on: the provider's last page, or where the provider sent the
        browser away to (an authorization's redirect_uri with its code and state), not fetched."""
        with httpx.Client(follow_redirects=False, timeout=10) as c:
            page = c.get(url)
            for _ in range(30):
                if page.is_redirect:
                    target = str(page.url.join(page.headers["location"]))
                    if not target.startswith(self.issuer):
                        return target
                    page = c.get(target)
                    continue
                form = _first_form(page.text, abort=abort)
                if form is None:
                    return str(page.url)
                action, fields = form
                if "login" in fields:
                    fields.update(login=account, password=password)
                page = c.post(page.url.join(action), data=fields)
                if "abort" in fields:  # refused: the provider then offers its code page again, not followed
                    return str(page.url)
            raise AssertionError(f"the provider's pages did not end after 30 steps; last: {page.url}")

    # -- tokens signed with the provider's own key ---------------------------------------------------
    def sign(self, claims: dict[str, Any], *, key: rsa.RSAPrivateKey | None = None, kid: str = "") -> str:
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def claims(self, sub: str, *, nonce: str = "", **over: Any) -> dict[str, Any]:
        """An ID token's claims as this provider would issue them to llmgw, ``over`` changed."""
        now = int(time.time())
        doc: dict[str, Any] = {"iss": self.issuer, "aud": self.client_id, "azp": self.client_id, "sub": sub,
                               "iat": now, "exp": now + 600, "groups": self.accounts().get(sub, {}).get("groups", [])}
        if nonce:
            doc["nonce"] = nonce
        doc.update(over)
        return {k: v for k, v in doc.items() if v is not None}

    # -- the process --------------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer, "port": self.port, "accounts_file": str(self.accounts_file),
            "cookie_keys": [secrets.token_urlsafe(24)],
            "jwks": {"keys": [_private_jwk(self.key, self.kid)]},
            "clients": [{
                "client_id": self.client_id, "client_secret": self.client_secret, "client_name": "llmgw",
                "token_endpoint_auth_method": "client_secret_basic",
                "grant_types": ["authorization_code", "refresh_token",
                                "urn:ietf:params:oauth:grant-type:device_code"],
                "response_types": ["code"], "redirect_uris": self.redirect_uris,
                # "native": a loopback redirect URI matches on any port (RFC 8252 7.3, as oidc-provider implements
                # it), so a test registers the UI's callback before its server has picked its port.
                "application_type": "native",
            }],
        }

    def start(self, *, timeout: float = 30.0) -> Self:
        argv = [*node(), str(HARNESS / "provider.mjs"), str(self.dir / "provider.json")]
        (self.dir / "provider.json").write_text(json.dumps(self._config()))
        (self.dir / "provider.json").chmod(0o600)
        self.proc = procs.Proc.start(argv, log_path=self.dir / "provider.log", cwd=HARNESS)
        try:
            self.proc.wait_http(f"{self.issuer}/.well-known/openid-configuration", timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def log_tail(self) -> str:
        return self.proc.log_tail() if self.proc is not None else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class _Forms(html.parser.HTMLParser):
    """The forms of a page: (id, action, {name: value}) and the submit buttons naming a form."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, str, dict[str, str]]] = []
        self.buttons: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append((a.get("id", ""), a.get("action", ""), {}))
        elif tag == "input" and self.forms and a.get("name"):
            self.forms[-1][2][a["name"]] = a.get("value", "")
        elif tag == "button":
            self.buttons.append(a)


def _first_form(text: str, *, abort: bool) -> tuple[str, dict[str, str]] | None:
    p = _Forms()
    p.feed(text)
    if not p.forms:
        return None
    form_id, action, fields = p.forms[0]
    for b in p.buttons:  # the device confirmation's abort button names the form from outside it
        if abort and b.get("name") == "abort" and b.get("form", form_id) == form_id:
            fields["abort"] = b.get("value", "yes")
    return action, dict(fields)
