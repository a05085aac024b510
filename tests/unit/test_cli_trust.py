"""``llmgw login``'s trust decisions (``cli.trust``) and the client's pinned verification, against real HTTPS
servers on loopback: the right hash pins, a wrong one is refused before anything is sent, no terminal and
no hash is refused, a pinned context meeting another CA says both hashes and how to re-pin (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli import client as client_mod
from llmgw.cli import contexts, trust
from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.testing.tlsserve import serving


@pytest.fixture(scope="module")
def ca() -> pki.Issued:
    return pki.create_ca()


@pytest.fixture(scope="module")
def other_ca() -> pki.Issued:
    return pki.create_ca(name="another cluster")


def test_the_right_hash_pins_the_ca_and_a_verified_request_follows(ca: pki.Issued) -> None:
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        pinned = trust.for_login([server.url], ca_hash=pki.ca_hash(ca.cert_pem))
        assert pinned == ca.cert_pem.decode()
        # Read unverified, then checked by a verified connection with that CA alone.
        assert server.requests == ["GET /api/v1/ca", "GET /healthz"]
        c = client_mod.Client(server.url, token="", urls=[server.url], ca=pinned)
        try:
            assert c.get("/healthz") == {"status": "ok"}
        finally:
            c.close()


def test_a_wrong_hash_is_refused_with_both_hashes_and_nothing_else_is_sent(ca: pki.Issued,
                                                                          other_ca: pki.Issued) -> None:
    wrong = pki.ca_hash(other_ca.cert_pem)
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        with pytest.raises(trust.Untrusted) as refused:
            trust.for_login([server.url], ca_hash=wrong)
        assert server.requests == ["GET /api/v1/ca"]
    said = str(refused.value)
    assert f"offers a CA with hash {pki.ca_hash(ca.cert_pem)}, not the --ca-hash {wrong} given" in said
    assert "nothing was sent" in said


def test_a_malformed_hash_says_the_shape_expected(ca: pki.Issued) -> None:
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        with pytest.raises(trust.Untrusted, match="expected sha256: and 64 hex digits"):
            trust.for_login([server.url], ca_hash="sha256:abc")


def test_no_terminal_and_no_hash_is_refused_naming_both_flags(ca: pki.Issued) -> None:
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        with pytest.raises(trust.Untrusted) as refused:
            trust.for_login([server.url], ask=None)
    said = str(refused.value)
    assert pki.ca_hash(ca.cert_pem) in said and "no terminal" in said
    assert "--ca-hash" in said and "--ca-file PATH" in said


def test_on_a_terminal_the_fingerprint_is_asked_and_only_yes_pins(ca: pki.Issued) -> None:
    asked: list[str] = []

    def yes(question: str) -> bool:
        asked.append(question)
        return True

    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        assert trust.for_login([server.url], ask=yes) == ca.cert_pem.decode()
        assert len(asked) == 1 and pki.ca_hash(ca.cert_pem) in asked[0]
        with pytest.raises(trust.Untrusted, match="the CA was not trusted; nothing was sent"):
            trust.for_login([server.url], ask=lambda _q: False)


def test_a_ca_file_is_trusted_as_given_and_a_server_of_another_ca_refused(ca: pki.Issued, other_ca: pki.Issued,
                                                                         tmp_path: Path) -> None:
    mine = tmp_path / "ca.crt"
    mine.write_bytes(ca.cert_pem)
    with serving(pki.server_cert(ca, ["127.0.0.1"]), None) as server:  # an operator's cert: no /api/v1/ca
        assert trust.for_login([server.url], ca_file=mine) == ca.cert_pem.decode()
        assert server.requests == ["GET /healthz"]
    with serving(pki.server_cert(other_ca, ["127.0.0.1"]), other_ca.cert_pem) as server:
        with pytest.raises(trust.Untrusted, match="no longer presents a certificate of the CA pinned"):
            trust.for_login([server.url], ca_file=mine)
    (tmp_path / "junk").write_text("not a certificate")
    with pytest.raises(trust.Untrusted, match="is not a PEM certificate"):
        trust.for_login(["https://127.0.0.1:1"], ca_file=tmp_path / "junk")


def test_a_certificate_of_the_right_ca_that_names_another_host_is_refused(ca: pki.Issued) -> None:
    """A node's engine certificate is signed by the cluster CA but names no host: it cannot pass for the server."""
    key = pki.new_key()
    engine = pki.Issued(pki.sign_engine_csr(ca, pki.create_csr("node1", key), "node1"), pki.key_pem(key))
    with serving(engine, ca.cert_pem) as server:
        with pytest.raises(trust.Untrusted) as refused:
            trust.for_login([server.url], ca_hash=pki.ca_hash(ca.cert_pem))
        assert "GET /healthz" not in server.requests
    said = str(refused.value)
    assert "presents a certificate that does not name 127.0.0.1" in said and "--tls-san NAME" in said


def test_a_server_keeping_the_ca_but_serving_another_certificate_says_to_re_pin_by_file(
        ca: pki.Issued, other_ca: pki.Issued) -> None:
    """An operator's certificate (another CA) while /api/v1/ca still offers the pinned one: --ca-file, not a hash."""
    with serving(pki.server_cert(other_ca, ["127.0.0.1"]), None) as server:
        with pytest.raises(trust.Untrusted) as refused:
            trust.check(server.url, ca.cert_pem.decode())
    assert "no longer presents a certificate of the CA pinned" in str(refused.value)  # it offers no CA at all
    with serving(pki.server_cert(other_ca, ["127.0.0.1"]), ca.cert_pem) as server:  # offers the pinned CA
        with pytest.raises(trust.Untrusted) as refused:
            trust.check(server.url, ca.cert_pem.decode())
    said = str(refused.value)
    assert "not of the CA pinned for it" in said and "though it still offers that CA" in said
    assert "--ca-file PATH" in said


def test_an_expired_certificate_names_the_dates(ca: pki.Issued) -> None:
    import datetime

    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    expired = pki.server_cert(ca, ["127.0.0.1"], now=old, validity=datetime.timedelta(days=1))
    with serving(expired, ca.cert_pem) as server:
        with pytest.raises(trust.Untrusted, match="outside its dates"):
            trust.for_login([server.url], ca_hash=pki.ca_hash(ca.cert_pem))


def test_plain_http_pins_nothing_and_refuses_the_flags() -> None:
    assert trust.for_login(["http://127.0.0.1:8080"]) == ""
    with pytest.raises(trust.Untrusted, match="for a control plane served over HTTPS"):
        trust.for_login(["http://127.0.0.1:8080"], ca_hash="sha256:" + "0" * 64)


def test_a_pinned_context_meeting_another_ca_says_both_hashes_and_how_to_re_pin(
        ca: pki.Issued, other_ca: pki.Issued, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command of the context verifies with its CA; a server of another CA is refused, token unsent."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in ("LLMGW_TOKEN", "LLMGW_URL", "LLMGW_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    with serving(pki.server_cert(other_ca, ["127.0.0.1"]), other_ca.cert_pem) as server:
        contexts.write(contexts.Credentials({"prod": contexts.Context("prod", [server.url], "admin", "t0ken",
                                                                      ca.cert_pem.decode())}, "prod"))
        c = client_mod.Client(server.url)
        try:
            with pytest.raises(LlmgwError) as refused:
                c.get("/api/v1/models")
        finally:
            c.close()
        assert server.requests == ["GET /api/v1/ca"]  # read to name its hash; the token went nowhere
    said = str(refused.value)
    assert f"pinned {pki.ca_hash(ca.cert_pem)}, the server's CA is {pki.ca_hash(other_ca.cert_pem)}" in said
    assert f"llmgw login --context prod --ca-hash {pki.ca_hash(other_ca.cert_pem)}" in said


def test_contexts_keep_their_ca_and_old_ones_read_without(ca: pki.Issued, tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    contexts.write(contexts.Credentials({"a": contexts.Context("a", ["https://h:1"], "u", "t", ca.cert_pem.decode()),
                                         "b": contexts.Context("b", ["http://h:2"], "u", "t")}, "a"), path)
    back = contexts.read(path)
    assert back.contexts["a"].ca == ca.cert_pem.decode() and back.contexts["b"].ca == ""
    assert trust.verify("") is True and trust.verify(ca.cert_pem.decode()) is not True


def test_a_script_without_a_context_trusts_the_ca_file_it_names(ca: pki.Issued, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMGW_URL + LLMGW_TOKEN scripts have no saved context to pin in: LLMGW_CA_FILE names the CA instead."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no context saved
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        monkeypatch.delenv(client_mod.CA_ENV, raising=False)
        c = client_mod.Client(server.url, token="t")
        try:
            with pytest.raises(LlmgwError):  # the system's authorities do not know the cluster CA
                c.get("/healthz")
        finally:
            c.close()
        monkeypatch.setenv(client_mod.CA_ENV, str(ca_file))
        c = client_mod.Client(server.url, token="t")
        try:
            assert c.get("/healthz") == {"status": "ok"}
        finally:
            c.close()
        (tmp_path / "not-a-cert").write_text("hello")
        monkeypatch.setenv(client_mod.CA_ENV, str(tmp_path / "not-a-cert"))
        c = client_mod.Client(server.url, token="t")
        try:
            with pytest.raises(LlmgwError, match="LLMGW_CA_FILE=.*not a PEM certificate"):
                c.get("/healthz")
        finally:
            c.close()
