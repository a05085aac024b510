"""The control plane's side of joining: one token use, one certificate per node id, the checks at Connect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.control import tokens
from llmgw.control.agentsvc import join
from llmgw.control.store import store as store_mod
from llmgw.core import pki

NOW = 1_800_000_000.0
CA = pki.create_ca()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[store_mod.Store]:
    s = store_mod.Store.open(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _token(store: store_mod.Store, *, node: str = "", uses: int = 1) -> str:
    token_id, secret = tokens.create_token(store, ttl_s=600, uses=uses, node_name=node, now=NOW)
    return f"{token_id}.{secret}"


def _join(store: store_mod.Store, token: str, asked: str, *, csr_cn: str = "") -> tuple[str, bytes]:
    csr = pki.create_csr(csr_cn or asked, pki.new_key())
    return join._join(store, CA, token=token, csr_pem=csr, asked_id=asked, peer="ipv4:10.0.0.9:5000",
                      validity_s=3600, now=NOW)


def _audit(store: store_mod.Store) -> list[tuple[str, str, str, str]]:
    return [(e.actor, e.action, e.object, e.outcome) for e in store.list_audit()]


def test_a_join_signs_the_asked_id_stores_the_serial_and_audits(store: store_mod.Store) -> None:
    """A fresh token: a certificate with CN = the id asked for (not the CSR's), its row, an "ok" audit row."""
    node_id, cert = _join(store, _token(store), "n1", csr_cn="someone-else")
    assert node_id == "n1" and pki.common_name(cert) == "n1"
    row = store.get_node_cert(join.serial_of(cert))
    assert row is not None and row.node_id == "n1" and row.revoked_at == 0 and row.not_after > NOW
    assert _audit(store) == [("join@ipv4:10.0.0.9:5000", "node join", "node/n1", "ok")]


def test_a_used_token_is_refused_and_audited(store: store_mod.Store) -> None:
    """The second use of a one-use token is refused with the token's message and an audit row."""
    token = _token(store)
    _join(store, token, "n1")
    with pytest.raises(join.JoinRefused, match="used as often as it may"):
        _join(store, token, "n2")
    assert _audit(store)[-1][2:] == ("node/n2", "refused")
    assert store.list_node_certs(node_id="n2") == []


def test_a_node_id_holding_a_certificate_needs_a_token_naming_it(store: store_mod.Store) -> None:
    """n1 again with a plain token is refused (no takeover); a token made for n1 joins it, its name winning."""
    _join(store, _token(store), "n1")
    with pytest.raises(join.JoinRefused, match="node n1 already has a certificate.*llmgw node revoke n1"):
        _join(store, _token(store), "n1")
    node_id, _ = _join(store, _token(store, node="n1"), "whatever-it-asked")
    assert node_id == "n1"
    assert len(store.list_node_certs(node_id="n1")) == 2
    # Once revoked, a plain token may join the id again.
    store.revoke_node_certs("n1", at=NOW)
    assert _join(store, _token(store), "n1")[0] == "n1"


def test_a_node_id_that_is_not_a_name_is_refused(store: store_mod.Store) -> None:
    """Spaces, slashes, an empty id and one past a common name's 64 are refused before anything is signed."""
    for bad in ("", "a b", "../x", "-lead", "n" * 65):
        with pytest.raises(join.JoinRefused, match="node id"):
            _join(store, _token(store), bad, csr_cn="x")
    assert store.list_node_certs() == []


def test_a_presented_certificate_unknown_or_revoked_is_refused(store: store_mod.Store) -> None:
    """At Connect: a certificate the store never issued, and one revoked, are refused with the serial and what to do."""
    _, cert = _join(store, _token(store), "n1")
    assert join._check_presented(store, cert, "n1") == ""
    stranger = pki.sign_csr(CA, pki.create_csr("n1", pki.new_key()), "n1")
    assert "not one this control plane issued" in join._check_presented(store, stranger, "n1")
    store.revoke_node_certs("n1", at=NOW)
    why = join._check_presented(store, cert, "n1")
    assert f"certificate {join.serial_of(cert)} of node n1 was revoked at" in why and "join again" in why


def test_renewal_names_the_streams_node_whatever_the_csr_says(store: store_mod.Store) -> None:
    """A RenewCert's certificate has the stream's node id as CN, and is stored."""
    cert = join._renew(store, CA, node_id="n1", csr_pem=pki.create_csr("n2", pki.new_key()), validity_s=60, now=NOW)
    assert pki.common_name(cert) == "n1"
    assert store.get_node_cert(join.serial_of(cert)) is not None


def test_a_renewal_with_a_csr_that_is_not_one_is_refused(store: store_mod.Store) -> None:
    """Garbage in RenewCert is a PkiError (the stream answers CertIssued with it), and nothing is stored."""
    with pytest.raises(pki.PkiError, match="not a PEM certificate request"):
        join._renew(store, CA, node_id="n1", csr_pem=b"\x00" * 64, validity_s=60, now=NOW)
    assert store.list_node_certs() == []
