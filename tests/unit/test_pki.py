"""The cluster CA, server and node certificates and the CA hash, checked as plain data (no files, no sockets)."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw.core import pki

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def ca() -> pki.Issued:
    return pki.create_ca(now=NOW)


def _item(der: bytes, start: int) -> tuple[int, int]:
    """(where the DER item at ``start`` has its contents, where it ends)."""
    length, i = der[start + 1], start + 2
    if length & 0x80:
        n = length & 0x7F
        length, i = int.from_bytes(der[i:i + n], "big"), i + n
    return i, i + length


def _spki_by_hand(cert: x509.Certificate) -> bytes:
    """The SubjectPublicKeyInfo cut out of the certificate's DER by walking it, not through cryptography's key API."""
    der = cert.public_bytes(serialization.Encoding.DER)
    tbs, _ = _item(der, 0)  # Certificate ::= SEQUENCE { tbsCertificate, ... }
    at, _ = _item(der, tbs)  # the tbsCertificate's first field
    if der[at] == 0xA0:  # [0] version, present in v3
        at = _item(der, at)[1]
    for _field in ("serial", "signature", "issuer", "validity", "subject"):
        at = _item(der, at)[1]
    return der[at:_item(der, at)[1]]


def _spki(csr: x509.CertificateSigningRequest) -> bytes:
    return csr.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def test_ca_is_a_p256_ca_that_signs_certificates_for_ten_years(ca: pki.Issued) -> None:
    """The CA is EC P-256, basicConstraints CA (critical), keyUsage certSign and crlSign, valid ten years."""
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign and not ku.value.digital_signature
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=3650) + pki.CLOCK_SKEW
    assert cert.not_valid_before_utc <= NOW and cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)


def test_server_certificate_names_the_hosts_and_loopback(ca: pki.Issued) -> None:
    """The server certificate's SANs are the given names and addresses plus localhost, 127.0.0.1 and ::1, once each."""
    issued = pki.server_cert(ca, ["cp1.example", "10.0.0.5", "localhost"], now=NOW)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["cp1.example", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(a) for a in ("10.0.0.5", "127.0.0.1",
                                                                                           "::1")]
    assert pki.subject_alt_names(issued.cert_pem) == ["cp1.example", "10.0.0.5", "localhost", "127.0.0.1", "::1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))


def test_signed_csr_gets_the_node_id_the_caller_gives_not_the_one_asked(ca: pki.Issued) -> None:
    """A node certificate has CN = the given node id (not the CSR's), the CSR's key, clientAuth and one year."""
    key = pki.new_key()
    csr = pki.create_csr("node-b", key)
    cert_pem = pki.sign_csr(ca, csr, "node-a", now=NOW)
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert pki.common_name(cert_pem) == "node-a"
    assert cert.public_key() == key.public_key()
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == \
        [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=365) + pki.CLOCK_SKEW
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))


def test_csr_whose_signature_does_not_match_is_refused(ca: pki.Issued) -> None:
    """A CSR altered after signing (its key swapped) is refused with a message, not signed."""
    good = x509.load_pem_x509_csr(pki.create_csr("n1", pki.new_key()))
    other = x509.load_pem_x509_csr(pki.create_csr("n1", pki.new_key()))
    # Splice other's SubjectPublicKeyInfo into good's request: the signature no longer covers the key.
    good_der = good.public_bytes(serialization.Encoding.DER)
    forged = good_der.replace(_spki(good), _spki(other))
    assert forged != good_der
    pem = x509.load_der_x509_csr(forged).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(pki.PkiError, match="signature does not match"):
        pki.sign_csr(ca, pem, "n1")
    with pytest.raises(pki.PkiError, match="not a PEM certificate request"):
        pki.sign_csr(ca, b"hello", "n1")


def test_ca_hash_is_sha256_of_the_spki_computed_independently(ca: pki.Issued) -> None:
    """ca_hash equals sha256 of the SPKI cut from the DER by hand, and is the same for a re-encoded certificate."""
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    expected = "sha256:" + hashlib.sha256(_spki_by_hand(cert)).hexdigest()
    assert pki.ca_hash(ca.cert_pem) == expected
    assert pki.ca_hash(ca.cert_pem.replace(b"\n", b"\r\n")) == expected
    assert pki.ca_hash(pki.create_ca(now=NOW).cert_pem) != expected  # another CA, another key, another hash


def test_check_ca_hash_accepts_the_right_one_and_refuses_others(ca: pki.Issued) -> None:
    """The right hash passes (any case); another CA's, a truncated or unprefixed hash is refused with a reason."""
    right = pki.ca_hash(ca.cert_pem)
    pki.check_ca_hash(ca.cert_pem, right)
    pki.check_ca_hash(ca.cert_pem, right.upper().replace("SHA256:", "sha256:"))
    with pytest.raises(pki.PkiError, match="not the cluster the join command came from"):
        pki.check_ca_hash(ca.cert_pem, pki.ca_hash(pki.create_ca().cert_pem))
    for bad in (right[:-1], right.removeprefix("sha256:"), "md5:" + right[7:]):
        with pytest.raises(pki.PkiError, match="expected sha256: and 64 hex digits"):
            pki.check_ca_hash(ca.cert_pem, bad)



def test_engine_certificate_serves_tls_only_for_its_node() -> None:
    """An engine's certificate: CN = the node, server auth only (it cannot open an agent stream), the SANs given."""
    ca = pki.create_ca()
    pem = pki.sign_engine_csr(ca, pki.create_csr("i-claim-another-node", pki.new_key()), "node-7")
    assert pki.common_name(pem) == "node-7"
    assert pki.engine_node(pki.load_cert(pem)) == "node-7"
    assert pki.subject_alt_names(pem) == []  # no name a client could take it for the control plane's
    eku = pki.load_cert(pem).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert pki.not_before(pem) < pki.not_after(pem)


def test_engine_certificate_refuses_a_request_of_another_curve() -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "n")])
    csr = (x509.CertificateSigningRequestBuilder().subject_name(name)
           .sign(ec.generate_private_key(ec.SECP384R1()), hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(pki.PkiError, match="P-256"):
        pki.sign_engine_csr(pki.create_ca(), csr, "n")


def test_a_server_or_node_certificate_is_no_engine_certificate() -> None:
    ca = pki.create_ca()
    assert pki.engine_node(pki.load_cert(pki.server_cert(ca, ["node-7"]).cert_pem)) is None
    assert pki.engine_node(pki.load_cert(pki.sign_csr(ca, pki.create_csr("node-7", pki.new_key()), "node-7"))) is None
