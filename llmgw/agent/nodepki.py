"""The node's identity on disk: ``<state_dir>/pki/`` holds ``ca.crt``, ``node.crt``, ``node.key`` and ``join.json``.

Written once by ``llmgw agent join`` (``join.py``), as a temporary directory renamed into place last, so a
join that failed half way leaves nothing that makes the next one refuse. Everything is 0600 in a 0700
directory: the key never leaves the node, and nobody but the agent's user needs the rest. Renewal
replaces ``node.crt`` only, written beside it and renamed over it, so an agent killed mid-write keeps
the old certificate and never a torn one; the key stays, and every CSR is made with it.

The node id is the certificate's common name: the control plane refuses a Register that names another.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from llmgw.core import pki
from llmgw.core.errors import LlmgwError

PKI = "pki"
JOIN_DOC = "join.json"


@dataclasses.dataclass(frozen=True, slots=True)
class NodePki:
    """Where this node's certificates are; read afresh at each connection, so a renewal takes effect there."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def cert(self) -> Path:
        return self.dir / "node.crt"

    @property
    def key(self) -> Path:
        return self.dir / "node.key"

    @property
    def doc(self) -> Path:
        return self.dir / JOIN_DOC

    def credentials(self) -> tuple[bytes, bytes, bytes]:
        """(CA, certificate, key) PEMs, as gRPC's channel credentials take them."""
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except OSError as e:
            raise LlmgwError(f"cannot read this node's certificates in {self.dir}: {e.strerror or e}; if they are "
                             f"lost, move {self.dir} aside and join again with `llmgw agent join`") from None

    def node_id(self) -> str:
        return pki.common_name(self.credentials()[1])

    def servers(self) -> list[str]:
        """The agent addresses ``join.json`` names (empty when it names none or cannot be read)."""
        try:
            doc = json.loads(self.doc.read_text())
        except (OSError, ValueError):
            return []
        servers = doc.get("servers") if isinstance(doc, dict) else None
        return [str(s) for s in servers] if isinstance(servers, list) else []

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.credentials()[2], password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise LlmgwError(f"{self.key} is not an EC key; it was not made by `llmgw agent join`")
        return key

    def renew_due(self, *, now: datetime.datetime | None = None) -> bool:
        """Whether the certificate is in the last third of its life (its skew allowance not counted)."""
        cert = pki.load_cert(self.credentials()[1])
        now = now or datetime.datetime.now(datetime.UTC)
        life = cert.not_valid_after_utc - (cert.not_valid_before_utc + pki.CLOCK_SKEW)
        return cert.not_valid_after_utc - now < life / 3

    def expiry_problem(self, *, now: datetime.datetime | None = None) -> str:
        """Why the certificate can no longer connect (it expired); empty while it is valid.

        gRPC reports an expired client certificate as a failed handshake and nothing more, so the agent
        says this itself: no renewal can help then, only a new join.
        """
        try:
            cert = pki.load_cert(self.credentials()[1])
        except LlmgwError as e:
            return str(e)
        if cert.not_valid_after_utc > (now or datetime.datetime.now(datetime.UTC)):
            return ""
        return (f"this node's certificate ({self.cert}) expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC "
                "and was not renewed in time (the agent was stopped for the last third of its life?); the control "
                f"plane refuses it: move {self.dir} aside and join again with a new token from `llmgw token create`")

    def replace_cert(self, cert_pem: bytes) -> None:
        """Writes a renewed certificate: beside the old one, 0600, then renamed over it."""
        tmp = self.dir / f".node.crt.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        _write_private(tmp, cert_pem)
        os.replace(tmp, self.cert)


def of(state_dir: Path) -> NodePki | None:
    """The node's certificates under ``state_dir``; None when it has not joined."""
    found = NodePki(state_dir / PKI)
    return found if found.dir.exists() else None


def write(state_dir: Path, *, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, servers: list[str],
          node_id: str) -> NodePki:
    """Writes a new ``pki/`` whole (a temporary directory renamed into place); refuses one that exists."""
    target = NodePki(state_dir / PKI)
    if target.dir.exists():
        raise LlmgwError(already_joined(target))
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".pki-{os.getpid()}"
    tmp.mkdir(mode=0o700)
    try:
        os.chmod(tmp, 0o700)
        _write_private(tmp / "ca.crt", ca_pem)
        _write_private(tmp / "node.crt", cert_pem)
        _write_private(tmp / "node.key", key_pem)
        _write_private(tmp / JOIN_DOC, json.dumps({"servers": servers, "node_id": node_id}).encode())
        os.rename(tmp, target.dir)
    except BaseException:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
        raise
    return target


def already_joined(found: NodePki) -> str:
    try:
        who = f" as node {found.node_id()}"
    except LlmgwError:
        who = ""
    return (f"this node has already joined{who} ({found.dir}); to join again, stop the agent and move {found.dir} "
            "aside (and `llmgw node revoke` the old node on the control plane if it should not come back)")


def _write_private(path: Path, data: bytes) -> None:
    # Created with its mode: written then chmod-ed, a key is readable by all for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
