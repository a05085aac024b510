"""The agent's side of joining: the CA picked by its hash, the certificates on disk, renewal's moment, identity."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from llmgw.agent import config, join, nodepki, settings, settingsload
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _joined(state: Path, node_id: str = "n1", *, days: float = 30, servers: tuple[str, ...] = ("10.0.0.1:8081",)
            ) -> nodepki.NodePki:
    ca = pki.create_ca(now=T0)
    key = pki.new_key()
    cert = pki.sign_csr(ca, pki.create_csr(node_id, key), node_id, now=T0, validity=datetime.timedelta(days=days))
    return nodepki.write(state, ca_pem=ca.cert_pem, cert_pem=cert, key_pem=pki.key_pem(key), servers=list(servers),
                         node_id=node_id)


def _settings(state: Path, **flags: object) -> settings.AgentSettings:
    return settingsload.load(path=None, env={}, flags={"state_dir": state, **flags})


def test_the_ca_is_picked_from_the_chain_by_its_hash() -> None:
    """Of the server's chain, the certificate whose key has the given hash is the CA; another hash is refused."""
    ca = pki.create_ca()
    server = pki.server_cert(ca, ["cp1"])
    chain = [server.cert_pem, ca.cert_pem]
    assert join.pick_ca(chain, pki.ca_hash(ca.cert_pem)) == ca.cert_pem
    other = pki.ca_hash(pki.create_ca().cert_pem)
    with pytest.raises(join.JoinError, match="not the cluster the join command came from") as e:
        join.pick_ca(chain, other)
    assert pki.ca_hash(ca.cert_pem) in str(e.value)  # it says what the server presented
    with pytest.raises(join.JoinError, match="expected sha256: and 64 hex digits"):
        join.pick_ca(chain, "sha256:abc")


def test_written_pki_is_owner_only_and_refuses_a_second_join(tmp_path: Path) -> None:
    """pki/ is 0700 with every file 0600; a second write refuses, naming the node it joined as."""
    found = _joined(tmp_path)
    assert oct(found.dir.stat().st_mode & 0o777) == "0o700"
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in found.dir.iterdir()} == {
        "ca.crt": "0o600", "node.crt": "0o600", "node.key": "0o600", "join.json": "0o600"}
    assert json.loads(found.doc.read_text()) == {"servers": ["10.0.0.1:8081"], "node_id": "n1"}
    with pytest.raises(LlmgwError, match="already joined as node n1"):
        _joined(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pki-")]


def test_renewal_is_due_in_the_last_third_of_the_life(tmp_path: Path) -> None:
    """A 30-day certificate is renewed from day 20 on, not before; the skew allowance is not life."""
    found = _joined(tmp_path, days=30)
    assert not found.renew_due(now=T0 + datetime.timedelta(days=19, hours=23))
    assert found.renew_due(now=T0 + datetime.timedelta(days=20, hours=1))


def test_a_renewed_certificate_replaces_the_old_and_keeps_the_key(tmp_path: Path) -> None:
    """replace_cert swaps node.crt (0600, no temporary file left) and leaves node.key as it was."""
    found = _joined(tmp_path)
    key_before = found.key.read_bytes()
    new = pki.sign_csr(pki.create_ca(), pki.create_csr("n1", found.private_key()), "n1")
    found.replace_cert(new)
    assert found.cert.read_bytes() == new
    assert oct(found.cert.stat().st_mode & 0o777) == "0o600"
    assert found.key.read_bytes() == key_before
    assert sorted(p.name for p in found.dir.iterdir()) == ["ca.crt", "join.json", "node.crt", "node.key"]


def test_a_joined_node_finds_its_servers_and_its_id(tmp_path: Path) -> None:
    """No server set anywhere: join.json's; the node id is the certificate's CN; a setting naming a server wins."""
    _joined(tmp_path, "gpu-07")
    st = _settings(tmp_path)
    assert st.servers == ["10.0.0.1:8081"]
    tls, node_id = config.identity(st)
    assert tls is not None and node_id == "gpu-07"
    assert _settings(tmp_path, servers=["cp2:9000"]).servers == ["cp2:9000"]


def test_a_node_id_other_than_the_certificates_is_refused_naming_both(tmp_path: Path) -> None:
    """--node-id gpu-08 on a node that joined as gpu-07 stops the agent, naming both."""
    _joined(tmp_path, "gpu-07")
    with pytest.raises(LlmgwError, match="joined as 'gpu-07'.*'gpu-08'"):
        config.identity(_settings(tmp_path, node_id="gpu-08"))


def test_an_unjoined_node_runs_only_insecure_on_loopback(tmp_path: Path) -> None:
    """No pki/: refused with the join command to run; --insecure works against loopback and nothing else."""
    with pytest.raises(LlmgwError, match="has not joined.*llmgw agent join.*--insecure"):
        config.identity(_settings(tmp_path, servers=["127.0.0.1:8081"]))
    tls, node_id = config.identity(_settings(tmp_path, servers=["127.0.0.1:8081"], insecure=True, node_id="dev"))
    assert (tls, node_id) == (None, "dev")
    with pytest.raises(LlmgwError, match="loopback development only.*cp1:8081"):
        config.identity(_settings(tmp_path, servers=["cp1:8081"], insecure=True))


def test_an_expired_certificate_is_named_with_the_way_out(tmp_path: Path) -> None:
    """Past its end the certificate's problem says it expired and to join again; before, there is none."""
    found = _joined(tmp_path, days=1)
    assert found.expiry_problem(now=T0 + datetime.timedelta(hours=23)) == ""
    why = found.expiry_problem(now=T0 + datetime.timedelta(days=2))
    assert "expired at 2026-01-02" in why and "join again" in why
