"""Which certificate authority the CLI trusts for a control plane served over HTTPS (issue 28).

A control plane's HTTPS certificate is either a public one (any system trusts it: nothing to pin) or one
from the cluster's own CA, which no system trusts. ``llmgw login`` then pins that CA, as ``llmgw agent join``
does: it reads ``GET /api/v1/ca`` over a connection it has not verified (nothing of ours is sent on it),
and trusts the certificate only when its hash is the ``--ca-hash`` given (``llmgw server`` prints it at
start, ``llmgw token create`` in its join command), or, on a terminal, when the user says yes to its
fingerprint. ``--ca-file`` takes an operator's own CA (a ``--tls-cert`` from a private CA) as it is. Then
a connection verified with that CA alone (the chain and the host name) must succeed before the password is
sent. The CA is stored in the context (``contexts.Context.ca``) and every later command of that context
verifies with it, on each of its URLs; a context without one (written before, or a public certificate)
uses the system's authorities.
"""

from __future__ import annotations

import socket
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from llmgw.core import pki
from llmgw.core.errors import LlmgwError

CA_PATH = "/api/v1/ca"
TIMEOUT_S = 10.0


class Untrusted(LlmgwError):
    """The server's certificate is not one to trust; the message says why and what to do."""


def verify(ca_pem: str) -> ssl.SSLContext | bool:
    """What httpx verifies a context's servers with: its pinned CA alone, or (none pinned) the system's."""
    if not ca_pem:
        return True
    return ssl.create_default_context(cadata=ca_pem)  # cadata given: no system authority is loaded


def is_https(url: str) -> bool:
    return url.lower().startswith("https://")


def cert_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind an httpx error, if that is what it was."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, ssl.SSLCertVerificationError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def fetch_ca(url: str, *, timeout: float = TIMEOUT_S) -> bytes:
    """The CA certificate (PEM) the server at ``url`` offers, read WITHOUT verifying it: the caller checks it.

    Nothing is sent but the request (no credential, no cookie); Untrusted when the server offers none.
    """
    try:
        with httpx.Client(verify=False, trust_env=False, timeout=timeout) as http:  # noqa: S501 (checked by hash)
            resp = http.get(url + CA_PATH)
    except httpx.HTTPError as e:
        raise Untrusted(f"cannot read the cluster CA from {url}{CA_PATH}: {e}") from None
    try:
        pem = str(resp.json()["pem"]).encode()
        pki.load_cert(pem)
    except (ValueError, KeyError, TypeError, pki.PkiError):
        raise Untrusted(f"{url} offers no cluster CA at {CA_PATH} (it answered {resp.status_code}): it is not an "
                        "llmgw control plane with TLS, or it serves a certificate of its own CA; pass that CA with "
                        "--ca-file PATH") from None
    return pem


def seen_hash(url: str) -> str:
    """The hash of the CA ``url`` offers now, or a few words saying it offers none (for a refusal's sentence)."""
    try:
        return pki.ca_hash(fetch_ca(url))
    except LlmgwError:
        return f"none (nothing at {CA_PATH})"


def check(url: str, ca_pem: str) -> None:
    """A connection to ``url`` verified with ``ca_pem`` (or, "", the system's authorities): the certificate must
    chain to it and name the URL's host. Untrusted saying which failed; nothing but ``GET /healthz`` is sent."""
    try:
        with httpx.Client(verify=verify(ca_pem), trust_env=False, timeout=TIMEOUT_S) as http:
            http.get(url + "/healthz")
    except httpx.HTTPError as e:
        failed = cert_failure(e)
        if failed is None:
            raise
        raise Untrusted(refusal(url, ca_pem, failed)) from None


#: OpenSSL's verify codes for a certificate that chains to a trusted CA but is wrong for this use.
_NAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH (and 64, the IP address's)
_DATES = (9, 10)  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED


def refusal(url: str, ca_pem: str, failed: ssl.SSLCertVerificationError, *, context: str = "") -> str:
    """Why ``url``'s certificate was refused, and how to go on, as one sentence."""
    relogin = f"llmgw login --context {context}" if context else f"llmgw login --url {url}"
    why = failed.verify_message or failed.reason or str(failed)
    code = failed.verify_code
    if code in (_NAME_MISMATCH, 64):
        return (f"the control plane at {url} presents a certificate that does not name {urlsplit(url).hostname} "
                f"({why}); give a URL with a name its certificate has, or add the name on the server "
                "(`llmgw server --tls-san NAME`)")
    if code in _DATES:
        return (f"the control plane at {url} presents a certificate outside its dates ({why}); check this "
                "machine's clock, and that the server renews its certificate")
    if not ca_pem:
        return (f"the control plane at {url} presents a certificate no system authority trusts ({why}); pin the "
                f"cluster's CA: `{relogin} --ca-hash sha256:…` with the hash `llmgw server` prints at start (or "
                "`llmgw token create` in its join command), or --ca-file PATH for an operator's own CA")
    pinned, seen = pki.ca_hash(ca_pem.encode()), seen_hash(url)
    if seen == pinned:  # it still offers the pinned CA, but its certificate is another's (an operator's own)
        return (f"the control plane at {url} presents a certificate that is not of the CA pinned for it ({pinned}), "
                f"though it still offers that CA ({why}); if it now serves an operator's certificate, re-pin "
                f"with `{relogin} --ca-file PATH` (that certificate's CA)")
    return (f"the control plane at {url} no longer presents a certificate of the CA pinned for it: pinned "
            f"{pinned}, the server's CA is {seen} ({why}); if its CA was replaced on purpose, re-pin it with "
            f"`{relogin} --ca-hash {seen if seen.startswith(pki.HASH_PREFIX) else 'sha256:…'}`, otherwise "
            "someone may be in between: do not log in")


def answering(urls: list[str], *, timeout: float = 3.0) -> str:
    """The first of ``urls`` whose host takes a connection (a context's control planes, one down), else the first."""
    for url in urls:
        parts = urlsplit(url)
        try:
            socket.create_connection((parts.hostname or "", parts.port or (443 if is_https(url) else 80)),
                                     timeout=timeout).close()
        except (OSError, ValueError):
            continue
        return url
    return urls[0]


def for_login(urls: list[str], *, ca_hash: str = "", ca_file: Path | None = None, known: str = "",
              ask: Callable[[str], bool] | None = None) -> str:
    """The CA (PEM, "" for the system's authorities) a login to ``urls`` pins, checked by a verified connection
    to the first that answers (a cluster's control planes share the CA).

    ``known``: the CA the context pinned before (kept while the server still verifies with it). ``ask``: on a
    terminal, asks the user a question and says whether they answered yes; None when there is no terminal.
    """
    if not any(is_https(u) for u in urls):
        if ca_hash or ca_file:
            raise Untrusted(f"--ca-hash and --ca-file are for a control plane served over HTTPS; {urls[0]} is plain "
                            "HTTP: give its https:// URL")
        return ""
    url = answering([u for u in urls if is_https(u)])
    if ca_file is not None:
        pem = _read_ca_file(ca_file)
    elif ca_hash:
        pem = fetch_ca(url)
        try:
            pki.check_ca_hash(pem, ca_hash.strip())
        except pki.PkiError:
            if not ca_hash.strip().startswith(pki.HASH_PREFIX) or len(ca_hash.strip()) != 71:
                raise Untrusted(f"--ca-hash {ca_hash!r}: expected sha256: and 64 hex digits, as `llmgw server` "
                                "prints it at start") from None
            raise Untrusted(f"the control plane at {url} offers a CA with hash {pki.ca_hash(pem)}, not the "
                            f"--ca-hash {ca_hash.strip()} given: nothing was sent to it; check the URL, and the "
                            "hash `llmgw server` printed at start (or `llmgw token create`)") from None
    elif known:
        check(url, known)  # the server still presents the CA pinned before: keep it, ask nothing
        return known
    else:
        try:
            check(url, "")
            return ""  # a public certificate: the system's authorities verify it, nothing to pin
        except Untrusted:
            pass
        pem = fetch_ca(url)
        fingerprint = pki.ca_hash(pem)
        if ask is None:
            raise Untrusted(f"the control plane at {url} presents a certificate of its own CA ({fingerprint}) and "
                            "there is no terminal to confirm it: pass --ca-hash with the hash `llmgw server` prints "
                            "at start (or `llmgw token create` prints), or --ca-file PATH for an operator's own CA")
        if not ask(f"The control plane at {url} presents a certificate of the cluster CA\n  {fingerprint}\n"
                   "Check it against the hash `llmgw server` printed at start. Trust this CA?"):
            raise Untrusted("the CA was not trusted; nothing was sent; log in again with --ca-hash from the "
                            "server's administrator")
    text = pem.decode()
    check(url, text)  # the chain and the host name, before any password
    return text


def _read_ca_file(path: Path) -> bytes:
    try:
        pem = path.read_bytes()
        pki.load_cert(pem)
    except OSError as e:
        raise Untrusted(f"cannot read --ca-file {path}: {e.strerror or e}") from None
    except (ValueError, pki.PkiError):
        raise Untrusted(f"--ca-file {path} is not a PEM certificate; give the CA certificate that signed the "
                        "server's (`curl -o ca.crt https://SERVER/api/v1/ca.crt` for the cluster's)") from None
    return pem


def terminal_ask(question: str) -> bool:
    """[y/N] on the terminal (stderr); anything but y/yes is no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, KeyboardInterrupt):
        return False
    return answer.strip().lower() in ("y", "yes")
