"""Node certificates on the control plane: join with a token, renewal on the stream, the checks at Connect.

Each decision here runs on the store's thread in one call (``Issuer.join`` and ``Issuer.renew`` hand
``_join``/``_renew`` to it whole): the token's check, the check for a certificate the node already has, and
the new row are one step, so two joins racing for one node id cannot both get a certificate.

Only a join that succeeds spends a use of its token: the token is checked first, and its use, the
revocation of the node's earlier certificates and the new certificate's row are one transaction
(``Store.admit_node``), so two joins racing for a token's last use cannot both succeed, and a refusal
(a bad CSR, a name taken) leaves the token as it was. A join of a node that had certificates (a rejoin
with ``llmgw token create --node N``) revokes them: before, the old agent kept connecting for a year.

The node id is the certificate's common name, decided here and never read from the CSR: a joining
node that put another's name in its request would otherwise be signed as that node.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
import time

from llmgw.control import tokens
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)

#: A node id: a DNS label's characters plus dots and underscores, as hostnames are; it becomes a CN (64 at most),
#: a path segment in the REST API and a log word, so no spaces, slashes or control characters.
NODE_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class JoinRefused(LlmgwError):
    """A join was refused; the message says why and what to do, and goes to the joining agent."""


@dataclasses.dataclass(frozen=True, slots=True)
class AgentTls:
    """What the agent service needs to run with mutual TLS; None in its place is ``--insecure``."""

    ca: pki.Issued = dataclasses.field(repr=False)
    server_cert_pem: bytes
    server_key_pem: bytes = dataclasses.field(repr=False)
    node_cert_validity_s: float = pki.NODE_VALIDITY.total_seconds()

    @property
    def chain_pem(self) -> bytes:
        """The server's certificate then the CA's: a joining agent finds the CA in it to check its hash."""
        return self.server_cert_pem.rstrip(b"\n") + b"\n" + self.ca.cert_pem


def serial_of(cert_pem: bytes) -> str:
    """The certificate's serial as the store keys it: lower-case hex without leading zeros."""
    return format(pki.load_cert(cert_pem).serial_number, "x")


def check_node_id(node_id: str) -> str:
    """Why ``node_id`` is not a usable node id; empty when it is."""
    if not node_id:
        return "the node id is empty; give --node-id or fix the hostname"
    if not NODE_ID_RE.match(node_id):
        return (f"node id {node_id[:80]!r} is not a name: letters, digits, '.', '_' and '-', starting with a letter "
                "or digit, at most 64 (a certificate's common name holds no more); give another with --node-id")
    return ""


def stored_cert(cert_pem: bytes, node_id: str, *, now: float) -> store_mod.StoredNodeCert:
    cert = pki.load_cert(cert_pem)
    return store_mod.StoredNodeCert(serial_of(cert_pem), node_id, now, cert.not_valid_after_utc.timestamp())


def _utc(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC)


def _join(store: store_mod.Store, ca: pki.Issued, *, token: str, csr_pem: bytes, asked_id: str, peer: str,
          validity_s: float, now: float) -> tuple[str, bytes]:
    """On the store's thread: the token's use, the checks, the signature and the row; JoinRefused otherwise."""
    actor = f"join@{peer}"
    try:
        granted = tokens.check(store, token, now=now)
    except tokens.TokenRefused as e:
        store.record_audit(actor=actor, action="node join", object=f"node/{asked_id[:80]}", outcome="refused",
                           detail=f"{e.reason}: {e}", at=now)
        raise JoinRefused(str(e)) from None
    node_id = granted.node_name or asked_id
    why = check_node_id(node_id)
    if not why:
        held = [c for c in store.list_node_certs(node_id=node_id) if not c.revoked_at and c.not_after > now]
        if held and not granted.node_name:
            why = (f"node {node_id} already has a certificate (serial {held[-1].serial}); to replace it, "
                   f"`llmgw node revoke {node_id}` first or make the token with `llmgw token create --node "
                   f"{node_id}`; if this is another machine, join it with its own --node-id")
    if not why:
        try:
            cert_pem = pki.sign_csr(ca, csr_pem, node_id, now=_utc(now),
                                    validity=datetime.timedelta(seconds=validity_s))
        except pki.PkiError as e:
            why = str(e)
    if why:
        store.record_audit(actor=actor, action="node join", object=f"node/{node_id[:80]}", outcome="refused",
                           detail=f"token {granted.token_id}: {why}", at=now)
        raise JoinRefused(why)
    revoked = store.admit_node(granted.token_id, stored_cert(cert_pem, node_id, now=now), now=now)
    if revoked is None:  # another join took the token's last use between the check and here
        e = tokens.used_up(granted.token_id)
        store.record_audit(actor=actor, action="node join", object=f"node/{node_id}", outcome="refused",
                           detail=f"{e.reason}: {e}", at=now)
        raise JoinRefused(str(e))
    store.record_audit(actor=actor, action="node join", object=f"node/{node_id}", outcome="ok",
                       detail=f"token {granted.token_id}, certificate {serial_of(cert_pem)}"
                              + (f"; {revoked} earlier certificate(s) of the node revoked" if revoked else ""),
                       at=now)
    return node_id, cert_pem


def _renew(store: store_mod.Store, ca: pki.Issued, *, node_id: str, csr_pem: bytes, validity_s: float,
           now: float) -> bytes:
    cert_pem = pki.sign_csr(ca, csr_pem, node_id, now=_utc(now), validity=datetime.timedelta(seconds=validity_s))
    store.add_node_cert(stored_cert(cert_pem, node_id, now=now))
    return cert_pem


def engine_cert(ca: pki.Issued, *, node_id: str, csr_pem: bytes, validity_s: float, now: float) -> bytes:
    """A node's engine serving certificate (``pki.sign_engine_csr``) for the stream's node id, never the CSR's.

    Not stored as a node certificate: it cannot open an agent stream (server auth only), so Connect never
    sees it; a node revoked loses its stream, and with it the renewal of this one.
    """
    return pki.sign_engine_csr(ca, csr_pem, node_id, now=_utc(now), validity=datetime.timedelta(seconds=validity_s))


def _check_presented(store: store_mod.Store, cert_pem: bytes, node_id: str) -> str:
    serial = serial_of(cert_pem)
    row = store.get_node_cert(serial)
    if row is None:
        return (f"certificate {serial} of node {node_id} is not one this control plane issued (its database was "
                "replaced?); join again with a new token from `llmgw token create`")
    if row.revoked_at:
        at = datetime.datetime.fromtimestamp(row.revoked_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (f"certificate {serial} of node {node_id} was revoked at {at}; join again with a new token from "
                f"`llmgw token create --node {node_id}` (on the node, move its state directory's pki/ aside first)")
    return ""


class Issuer:
    """The CA at work for the agent service: every store step awaited on the store's thread."""

    def __init__(self, tls: AgentTls, db: StoreThread) -> None:
        self.tls, self.db = tls, db

    async def join(self, *, token: str, csr_pem: bytes, asked_id: str, peer: str) -> tuple[str, bytes]:
        """(node id, certificate PEM) for a token and a CSR; JoinRefused with the reason."""
        return await self.db.call(_join, self.db.store, self.tls.ca, token=token, csr_pem=csr_pem, asked_id=asked_id,
                                  peer=peer, validity_s=self.tls.node_cert_validity_s, now=time.time())

    async def renew(self, node_id: str, csr_pem: bytes) -> bytes:
        """A new certificate for ``node_id`` (the stream's, never the CSR's subject); PkiError when refused."""
        return await self.db.call(_renew, self.db.store, self.tls.ca, node_id=node_id, csr_pem=csr_pem,
                                  validity_s=self.tls.node_cert_validity_s, now=time.time())

    def engine(self, node_id: str, csr_pem: bytes) -> bytes:
        """An engine certificate for ``node_id`` (the stream's); PkiError when refused. No store step."""
        return engine_cert(self.tls.ca, node_id=node_id, csr_pem=csr_pem,
                           validity_s=self.tls.node_cert_validity_s, now=time.time())

    async def check_presented(self, cert_pem: bytes, node_id: str) -> str:
        """Why a certificate that passed the TLS handshake is refused still (unknown, revoked); empty when not."""
        return await self.db.call(_check_presented, self.db.store, cert_pem, node_id)
