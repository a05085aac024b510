"""The HTTP port's certificate from the cluster CA: issued for the server's names, renewed before it expires.

``llmgw server`` with TLS and no ``--tls-cert`` serves ``DATA_DIR/pki/api.crt`` (the leaf, then the cluster
CA, so a client gets the chain) and ``api.key`` (0600). :func:`ensure` issues them when they are missing, name
other hosts than the server is given, come from another CA, are valid for longer than ``--tls-cert-validity``
or are past two thirds of it; both files are replaced atomically (a temporary file renamed over each), the key
first. The server's ``tlslisten.CertReloader`` and each router worker's watch the two files, so a renewal
reaches every process the way an operator's renewal of ``--tls-cert`` does, without a restart or a failed
request. :class:`Renewer` checks every few minutes (sooner for a short validity).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket
import tempfile
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from llmgw.control import datadir
from llmgw.core import pki
from llmgw.router import tlslisten

log = logging.getLogger("llmgw.serve")

API_CRT = "api.crt"
API_KEY = "api.key"
#: Issued again once less than this share of the validity is left (at two thirds of its life).
RENEW_LEFT = 1 / 3


def paths(data_dir: Path) -> tuple[Path, Path]:
    """``DATA_DIR/pki/api.crt`` and ``api.key``."""
    return data_dir / datadir.PKI / API_CRT, data_dir / datadir.PKI / API_KEY


def names(*, host: str, advertise: str, sans: tuple[str, ...]) -> list[str]:
    """The hosts the certificate is for: ``--advertise-address``, each ``--tls-san``, then ``--host`` (this machine's
    FQDN when it is a wildcard); the loopback names are added by ``pki.server_cert``."""
    wildcard = host in ("0.0.0.0", "::", "")
    given = [advertise, *sans, socket.getfqdn() if wildcard else host]
    out: list[str] = []
    for name in given:
        name = name.strip().strip("[]")
        if name and name not in out:
            out.append(name)
    return out


def _canonical(hosts: list[str]) -> set[str]:
    """The SANs a certificate for ``hosts`` carries, as ``pki.subject_alt_names`` gives them back."""
    out = set()
    for host in [*hosts, *pki.LOOPBACK_NAMES]:
        try:
            out.add(str(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            out.add(host)
    return out


def why_issue(cert_pem: bytes | None, ca_pem: bytes, hosts: list[str], validity_s: float,
              now: datetime.datetime) -> str:
    """Why the certificate must be issued (again), or "" while it serves: a pure decision on the bytes."""
    if cert_pem is None:
        return "there is none yet"
    try:
        cert = pki.load_cert(cert_pem)
        cert.verify_directly_issued_by(pki.load_cert(ca_pem))
    except (pki.PkiError, ValueError, TypeError, InvalidSignature):
        return "it was not issued by this cluster's CA"
    if set(pki.subject_alt_names(cert_pem)) != _canonical(hosts):
        return f"the names changed (now {', '.join([*hosts, *pki.LOOPBACK_NAMES])})"
    left = (cert.not_valid_after_utc - now).total_seconds()
    if left > validity_s + 600:
        return f"it is valid for longer than --tls-cert-validity ({validity_s:g}s)"
    if left < validity_s * RENEW_LEFT:
        return "it is past two thirds of its validity" if left > 0 else "it expired"
    return ""


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Writes ``data`` to ``path`` atomically: a temporary file of ``mode`` beside it, renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure(data_dir: Path, hosts: list[str], validity_s: float, *, now: datetime.datetime | None = None) -> str:
    """Issues ``api.crt``/``api.key`` when :func:`why_issue` says so; the reason ("" when nothing was done)."""
    now = now or datetime.datetime.now(datetime.UTC)
    crt, key = paths(data_dir)
    ca = datadir.read_ca(data_dir)
    try:
        current: bytes | None = crt.read_bytes()
    except FileNotFoundError:
        current = None
    reason = why_issue(current, ca.cert_pem, hosts, validity_s, now)
    if not reason:
        return ""
    # pki.server_cert starts validity CLOCK_SKEW early and ends it validity_s after now.
    issued = pki.server_cert(ca, hosts, now=now, validity=datetime.timedelta(seconds=validity_s))
    _replace(key, issued.key_pem, 0o600)
    _replace(crt, issued.cert_pem + ca.cert_pem, 0o644)
    log.info("issued the HTTP port's certificate from the cluster CA (%s): for %s, valid until %s", reason,
             ", ".join([*hosts, *pki.LOOPBACK_NAMES]), pki.not_after(issued.cert_pem).isoformat(timespec="seconds"))
    return reason


class Renewer:
    """Keeps the cluster-CA certificate current, and the server's own listener on the newest one at once."""

    def __init__(self, data_dir: Path, hosts: list[str], validity_s: float, reloader: tlslisten.CertReloader) -> None:
        self.data_dir = data_dir
        self.hosts = hosts
        self.validity_s = validity_s
        self.reloader = reloader
        #: Seconds between checks: a 30th of the validity, at least 1 s and at most 5 minutes.
        self.every_s = min(300.0, max(1.0, validity_s / 30))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                if await asyncio.to_thread(ensure, self.data_dir, self.hosts, self.validity_s):
                    self.reloader.poll()   # this process at once; the workers at their next look (2 s)
            except Exception:   # the current certificate keeps serving; the next check tries again
                log.exception("renewing the HTTP port's certificate in %s failed", self.data_dir / datadir.PKI)
