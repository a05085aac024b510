"""The cluster's X.509 pieces, as pure functions of bytes: a CA, the server's and nodes' certificates.

Here and not in ``control`` because both ends need it: the control plane makes the CA and signs
CSRs, the agent makes its key and CSR and checks the server's CA against the join command's hash.
No file is read or written here (``llmgw.control.datadir`` writes the control plane's).

Keys are ECDSA on P-256 with SHA-256 signatures. Ed25519 was the other choice: smaller and faster,
but browsers refuse Ed25519 server certificates (the admin UI will be served with this server
certificate), and gRPC's TLS only takes it in TLS 1.3 on some builds; P-256 works on every TLS stack
we meet. Everything uses `cryptography`; nothing shells out to ``openssl``.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.core.errors import LlmgwError

CA_VALIDITY = datetime.timedelta(days=3650)
SERVER_VALIDITY = datetime.timedelta(days=365)
NODE_VALIDITY = datetime.timedelta(days=365)
#: Always in the server certificate, so the local agent and CLI can reach it by any loopback name.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: A clock a little behind ours must not see a certificate from the future ("certificate is not yet valid").
CLOCK_SKEW = datetime.timedelta(minutes=5)
HASH_PREFIX = "sha256:"


class PkiError(LlmgwError):
    """A certificate, CSR or CA hash was refused; the message says why and what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, both PEM; the key is unencrypted, so store it 0600."""

    cert_pem: bytes
    key_pem: bytes


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def load_cert(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise PkiError(f"not a PEM certificate ({e}); expected the text between BEGIN/END CERTIFICATE") from None


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             validity: datetime.timedelta, now: datetime.datetime | None) -> x509.CertificateBuilder:
    start = (now or datetime.datetime.now(datetime.UTC)) - CLOCK_SKEW
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + CLOCK_SKEW + validity)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         encipher_only=False, decipher_only=False)


def create_ca(*, name: str = "llmgw cluster CA", now: datetime.datetime | None = None,
              validity: datetime.timedelta = CA_VALIDITY) -> Issued:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = new_key()
    cert = (_builder(_name(name), _name(name), key.public_key(), validity, now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def _ca(ca: Issued) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError("the CA key is not an EC key; it was not made by `llmgw init`")
    return load_cert(ca.cert_pem), key


def _leaf(ca: Issued, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, validity: datetime.timedelta,
          now: datetime.datetime | None) -> x509.CertificateBuilder:
    ca_cert, _ = _ca(ca)
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (_builder(subject, ca_cert.subject, public_key, validity, now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False))


def server_cert(ca: Issued, hosts: list[str], *, now: datetime.datetime | None = None,
                validity: datetime.timedelta = SERVER_VALIDITY) -> Issued:
    """The control plane's certificate: ``hosts`` (names or IP addresses) and the loopback names as SANs."""
    names = _alt_names([*hosts, *LOOPBACK_NAMES])
    key = new_key()
    _, ca_key = _ca(ca)
    cert = (_leaf(ca, _name(hosts[0] if hosts else "localhost"), key.public_key(), validity, now)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def create_csr(node_id: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The agent's request (PEM); its key stays on the node."""
    return x509.CertificateSigningRequestBuilder().subject_name(_name(node_id)).sign(key, hashes.SHA256()) \
        .public_bytes(serialization.Encoding.PEM)


def _requested_key(csr_pem: bytes) -> ec.EllipticCurvePublicKey:
    """The key a certificate request (PEM) asks a certificate for, once the request is checked: it parses, its
    signature is its key's, and the key is EC P-256. PkiError saying which check failed."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        raise PkiError(f"not a PEM certificate request ({e}); the agent sends one it made itself") from None
    if not csr.is_signature_valid:
        raise PkiError("the certificate request's signature does not match its key; make a new request")
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != "secp256r1":
        raise PkiError("the certificate request's key is not EC P-256; the agent makes its key with "
                       "llmgw.core.pki.new_key()")
    return public_key


def sign_csr(ca: Issued, csr_pem: bytes, node_id: str, *, now: datetime.datetime | None = None,
             validity: datetime.timedelta = NODE_VALIDITY) -> bytes:
    """A node certificate (PEM) for the CSR's key with CN = ``node_id``, whatever the CSR's subject said.

    The caller decides the node id (the token's node name when it has one); taking the CSR's CN as given
    would let a joining node name itself after another.
    """
    public_key = _requested_key(csr_pem)
    if not node_id:
        raise PkiError("a node certificate needs a node id for its common name")
    _, ca_key = _ca(ca)
    cert = (_leaf(ca, _name(node_id), public_key, validity, now)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def _alt_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            gn: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(h.strip("[]")))
        except ValueError:
            gn = x509.DNSName(h)
        if gn not in names:
            names.append(gn)
    return names


#: The organizational unit of an engine's certificate: routers take an engine to be a node's only when its
#: certificate says it is one (an API or node certificate of the same CA, whatever its CN, is not).
ENGINE_UNIT = "llmgw-engine"


def sign_engine_csr(ca: Issued, csr_pem: bytes, node_id: str, *, now: datetime.datetime | None = None,
                    validity: datetime.timedelta = NODE_VALIDITY) -> bytes:
    """The certificate a node's engines serve TLS with (PEM): CN = ``node_id``, OU = ``ENGINE_UNIT``, server auth.

    Its own key, never the node's: an engine runs as its own user and may run a model's code, and the node's
    key (client auth, the agent stream) must stay the agent's. Server auth only, so it cannot open an agent
    stream. No subject alternative name, on purpose: a node could otherwise ask for the control plane's name or
    address and pass for it to every client that trusts the cluster CA; routers check the subject instead
    (:func:`engine_node`), so one node's engine certificate cannot pass for another node's engine either.
    """
    public_key = _requested_key(csr_pem)
    if not node_id:
        raise PkiError("an engine certificate needs a node id for its common name")
    _, ca_key = _ca(ca)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ENGINE_UNIT),
                         x509.NameAttribute(NameOID.COMMON_NAME, node_id)])
    return (_leaf(ca, subject, public_key, validity, now)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def engine_node(cert: x509.Certificate) -> str | None:
    """The node an engine certificate was issued for; None when it is not an engine certificate."""
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(units) != 1 or units[0].value != ENGINE_UNIT or len(names) != 1:
        return None
    return str(names[0].value)


def not_after(cert_pem: bytes) -> datetime.datetime:
    """When the certificate expires (UTC)."""
    return load_cert(cert_pem).not_valid_after_utc


def not_before(cert_pem: bytes) -> datetime.datetime:
    """When the certificate starts to be valid (UTC)."""
    return load_cert(cert_pem).not_valid_before_utc


def common_name(cert_pem: bytes) -> str:
    attrs = load_cert(cert_pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def subject_alt_names(cert_pem: bytes) -> list[str]:
    """The certificate's DNS names and IP addresses, in its order; empty when it has none."""
    try:
        ext = load_cert(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(n.value) for n in ext.value]


def ca_hash(cert_pem: bytes) -> str:
    """``sha256:<hex>`` of the CA's SubjectPublicKeyInfo (DER), as kubeadm's --discovery-token-ca-cert-hash.

    The public key, not the certificate: re-issuing the CA with the same key keeps every join command valid.
    """
    spki = load_cert(cert_pem).public_key().public_bytes(serialization.Encoding.DER,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    return HASH_PREFIX + hashlib.sha256(spki).hexdigest()


def check_ca_hash(ca_pem: bytes, expected: str) -> None:
    """Refuses a CA whose hash is not ``expected``; compared in constant time."""
    if not expected.startswith(HASH_PREFIX) or len(expected) != len(HASH_PREFIX) + 64:
        raise PkiError(f"--ca-hash {expected!r}: expected sha256: and 64 hex digits, as `llmgw token create` "
                       "prints it")
    got = ca_hash(ca_pem)
    if not hmac.compare_digest(got.encode(), expected.lower().encode()):
        raise PkiError(f"the server's CA has hash {got}, not the {expected} given; this is not the cluster the "
                       "join command came from (or someone is in between): check the server address and ask "
                       "its administrator for a new join command")
