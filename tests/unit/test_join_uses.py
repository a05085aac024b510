"""A join token's uses: only a join that succeeds spends one, and its last use goes to exactly one join.

Found by an attacker's probe: a 5-use token had 1 use left after 1 join and 3 refusals, because the use
was taken before the checks that refused them.
"""

from __future__ import annotations

import threading
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


def _join(store: store_mod.Store, token: str, asked: str, *, csr: bytes | None = None) -> tuple[str, bytes]:
    return join._join(store, CA, token=token, csr_pem=csr or pki.create_csr(asked, pki.new_key()), asked_id=asked,
                      peer="ipv4:10.0.0.9:5000", validity_s=3600, now=NOW)


def test_refused_joins_leave_the_token_its_uses(store: store_mod.Store) -> None:
    """1 join and 3 refusals (a bad id, a bad CSR, a name taken) of a 5-use token leave it 4 uses."""
    token_id, secret = tokens.create_token(store, ttl_s=600, uses=5, now=NOW)
    token = f"{token_id}.{secret}"
    _join(store, token, "n1")
    with pytest.raises(join.JoinRefused, match="node id"):
        _join(store, token, "a b")
    with pytest.raises(join.JoinRefused):
        _join(store, token, "n2", csr=b"-----BEGIN CERTIFICATE REQUEST-----\nnot one\n")
    with pytest.raises(join.JoinRefused, match="node n1 already has a certificate"):
        _join(store, token, "n1")
    row = store.get_token(token_id)
    assert row is not None and row.uses_left == 4
    assert [e.outcome for e in store.list_audit()] == ["ok", "refused", "refused", "refused"]


def test_a_token_checked_by_two_joins_is_spent_by_one(store: store_mod.Store) -> None:
    """Both joins passed the check; the store's one transaction lets only the first take the last use."""
    token_id, secret = tokens.create_token(store, ttl_s=600, uses=1, now=NOW)
    first = join.stored_cert(pki.sign_csr(CA, pki.create_csr("a", pki.new_key()), "a"), "a", now=NOW)
    second = join.stored_cert(pki.sign_csr(CA, pki.create_csr("b", pki.new_key()), "b"), "b", now=NOW)
    tokens.check(store, f"{token_id}.{secret}", now=NOW)
    assert store.admit_node(token_id, first, now=NOW) == 0
    assert store.admit_node(token_id, second, now=NOW) is None
    assert [c.node_id for c in store.list_node_certs()] == ["a"]  # nothing of the refused one was written


def test_two_concurrent_joins_of_a_one_use_token_one_succeeds(tmp_path: Path) -> None:
    """Two threads, each with its own connection, join with one 1-use token at once: one node, one refusal."""
    stores = [store_mod.Store.open(tmp_path) for _ in range(2)]
    try:
        token_id, secret = tokens.create_token(stores[0], ttl_s=600, uses=1, now=NOW)
        start = threading.Barrier(2)
        outcomes: dict[str, str] = {}

        def one(store: store_mod.Store, node: str) -> None:
            csr = pki.create_csr(node, pki.new_key())
            start.wait()
            try:
                _join(store, f"{token_id}.{secret}", node, csr=csr)
                outcomes[node] = "joined"
            except join.JoinRefused as e:
                outcomes[node] = str(e)

        threads = [threading.Thread(target=one, args=(st, n)) for st, n in zip(stores, ("a", "b"), strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(o == "joined" for o in outcomes.values()) == [False, True], outcomes
        assert any("used as often as it may" in o for o in outcomes.values()), outcomes
        assert len(stores[0].list_node_certs()) == 1
    finally:
        for s in stores:
            s.close()


def test_a_rejoin_revokes_the_nodes_earlier_certificates(store: store_mod.Store) -> None:
    """A join with a token made for n1 revokes n1's certificate; the audit row says how many were."""
    _, old = _join(store, f"{'.'.join(tokens.create_token(store, ttl_s=600, uses=1, now=NOW))}", "n1")
    _, new = _join(store, f"{'.'.join(tokens.create_token(store, ttl_s=600, uses=1, node_name='n1', now=NOW))}",
                   "n1")
    assert store.get_node_cert(join.serial_of(old)).revoked_at == NOW  # type: ignore[union-attr]
    assert store.get_node_cert(join.serial_of(new)).revoked_at == 0  # type: ignore[union-attr]
    assert "was revoked at" in join._check_presented(store, old, "n1")
    assert join._check_presented(store, new, "n1") == ""
    assert "1 earlier certificate(s) of the node revoked" in store.list_audit()[-1].detail
