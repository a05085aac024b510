"""How a standalone router trusts an https:// control plane (issue 28): ``--control-ca`` or ``--control-ca-hash``.

With ``--control-ca FILE`` every session to the control plane verifies its certificate with that CA alone
(the cluster's, or an operator's own for ``llmgw server --tls-cert``). With ``--control-ca-hash sha256:…``
the router reads ``GET /api/v1/ca`` at start over a connection it does not verify (nothing of its own is
sent: no credential), keeps the CA only when its hash is the one given (``pki.check_ca_hash``, constant
time) and then verifies with it alone, as ``llmgw agent join`` does; a mismatch stops the router before it
sends its token anywhere. With neither, the system's authorities verify (a public certificate). The context
made here is handed to every session that talks to the control plane: the table's long poll
(``watch``), usage and quota (``usagehttp``), events (``reports``), load signals (``signals``), and a hub's
upstream and relay (``hub``).
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from llmgw.core import pki

log = logging.getLogger("llmgw.router")
CA_PATH = "/api/v1/ca"


class TrustError(ValueError):
    """The control plane's CA could not be trusted; the message says why and what to do."""


def session(ssl_context: ssl.SSLContext | None, **kw: object) -> aiohttp.ClientSession:
    """An aiohttp session whose connections verify with ``ssl_context`` (None: aiohttp's default, the system's)."""
    if ssl_context is None:
        return aiohttp.ClientSession(**kw)  # type: ignore[arg-type]
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context), **kw)  # type: ignore[arg-type]


def context_of(ca_pem: bytes) -> ssl.SSLContext:
    """Verifies with ``ca_pem`` alone (the chain and the host name); no system authority."""
    return ssl.create_default_context(cadata=ca_pem.decode())


def read_ca_file(path: Path) -> bytes:
    try:
        pem = path.read_bytes()
        pki.load_cert(pem)
    except OSError as e:
        raise TrustError(f"cannot read --control-ca {path}: {e.strerror or e}") from None
    except pki.PkiError:
        raise TrustError(f"--control-ca {path} is not a PEM certificate; give the CA that signed the control "
                         "plane's certificate (the cluster's: GET /api/v1/ca.crt, checked against its hash)") from None
    return pem


def fetch_ca(url: str, *, timeout: float) -> bytes:
    """The CA (PEM) the control plane at ``url`` serves, read without verifying (the caller checks its hash).

    OSError when it does not answer; TrustError when it answers without a CA.
    """
    parts = urlsplit(url)
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE  # only to read the CA, whose hash is checked; nothing of ours is sent
    conn = http.client.HTTPSConnection(parts.hostname or "", parts.port or 443, timeout=timeout, context=unverified)
    try:
        conn.request("GET", CA_PATH)
        resp = conn.getresponse()
        body = resp.read(1 << 20)
    finally:
        conn.close()
    try:
        pem = str(json.loads(body)["pem"]).encode()
        pki.load_cert(pem)
    except (ValueError, KeyError, TypeError, pki.PkiError):
        raise TrustError(f"the control plane at {url} serves no cluster CA at {CA_PATH} (HTTP {resp.status}): with "
                         "a certificate of an operator's own CA give it with --control-ca FILE instead of "
                         "--control-ca-hash") from None
    return pem


def resolve(urls: Sequence[str], *, ca_file: Path | None, ca_hash: str, timeout: float = 10.0,
            retry_s: Callable[[int], float] = lambda n: min(5.0, 0.2 * 2 ** n),
            sleep: Callable[[float], None] = time.sleep) -> ssl.SSLContext | None:
    """The SSL context every session to ``urls`` uses; None: the system's authorities (or plain HTTP).

    With ``ca_hash``, the control planes are tried in turn until one answers (a router may start before its
    control plane); a CA of another hash is refused at once (TrustError naming both).
    """
    if ca_file is not None:
        return context_of(read_ca_file(ca_file))
    if not ca_hash:
        return None
    tls = [u for u in urls if u.lower().startswith("https://")]
    attempt = 0
    while True:
        for url in tls:
            try:
                pem = fetch_ca(url, timeout=timeout)
            except OSError as e:
                log.warning("cannot read the cluster CA from %s to check --control-ca-hash: %s", url, e)
                continue
            try:
                pki.check_ca_hash(pem, ca_hash)
            except pki.PkiError:
                raise TrustError(f"the control plane at {url} serves a CA with hash {pki.ca_hash(pem)}, not the "
                                 f"--control-ca-hash {ca_hash} given: nothing was sent to it; check the URL and the "
                                 "hash (`llmgw server` prints it at start, `llmgw token create` too)") from None
            log.info("control plane CA %s checked at %s: every session to the control plane verifies with it",
                     ca_hash, url)
            return context_of(pem)
        sleep(retry_s(attempt))
        attempt += 1

