"""Join tokens on a real SQLite store, and the data directory's files and modes after ``init``."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import argon2
import pytest

from llmgw.control import datadir, tokens
from llmgw.control.store.store import Store
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

T0 = 1_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "data")
    yield s
    s.close()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_token_is_kubeadm_shaped_and_stored_only_as_a_hash(store: Store) -> None:
    """A token is [a-z0-9]{6}.[a-z0-9]{16}; the store holds its sha256, node name, expiry and uses, not the secret."""
    token_id, secret = tokens.create_token(store, ttl_s=3600, uses=2, node_name="gpu7", now=T0)
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", f"{token_id}.{secret}")
    row = store.get_token(token_id)
    assert row is not None and row.sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert (row.node_name, row.expires_at, row.uses_left) == ("gpu7", T0 + 3600, 2)
    with store.engine.connect() as c:
        dumped = "\n".join(c.connection.iterdump())  # type: ignore[attr-defined]
    assert secret not in dumped


def test_token_uses_run_out(store: Store) -> None:
    """A two-use token admits two joins and refuses the third as UsedUp; the grant carries the node name."""
    token = ".".join(tokens.create_token(store, ttl_s=60, uses=2, node_name="n1", now=T0))
    assert tokens.consume(store, token, now=T0 + 1) == tokens.Granted(token[:6], "n1")
    assert tokens.consume(store, token, now=T0 + 2).node_name == "n1"
    with pytest.raises(tokens.TokenRefused, match="used as often as it may") as e:
        tokens.consume(store, token, now=T0 + 3)
    assert e.value.reason is tokens.Refused.UsedUp


def test_expired_token_is_refused_and_not_spent(store: Store) -> None:
    """At its expiry time a token is refused as Expired, and its use is not taken."""
    token_id, secret = tokens.create_token(store, ttl_s=60, uses=1, now=T0)
    with pytest.raises(tokens.TokenRefused, match="expired") as e:
        tokens.consume(store, f"{token_id}.{secret}", now=T0 + 60)
    assert e.value.reason is tokens.Refused.Expired
    assert store.get_token(token_id).uses_left == 1  # type: ignore[union-attr]
    assert tokens.consume(store, f"{token_id}.{secret}", now=T0 + 59).token_id == token_id


@pytest.mark.parametrize("mangle", ["unknown-id", "wrong-secret"])
def test_unknown_token_or_wrong_secret_is_refused_as_unknown(store: Store, mangle: str) -> None:
    """An id never made, or a known id with another secret, is refused as Unknown and spends nothing."""
    token_id, secret = tokens.create_token(store, ttl_s=60, uses=1, now=T0)
    token = f"zzzzzz.{secret}" if mangle == "unknown-id" else f"{token_id}.{'0' * 16}"
    with pytest.raises(tokens.TokenRefused, match="not known here") as e:
        tokens.consume(store, token, now=T0)
    assert e.value.reason is tokens.Refused.Unknown
    assert store.get_token(token_id).uses_left == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("token", ["", "abcdef", "abcdef.0123456789abcdeF", "abcde.0123456789abcdef0",
                                   "abcdef.0123456789abcdef\n.x", "ABCDEF.0123456789ABCDEF"])
def test_malformed_token_is_refused(store: Store, token: str) -> None:
    """Anything not [a-z0-9]{6}.[a-z0-9]{16} is refused as Malformed, with the expected form in the message."""
    with pytest.raises(tokens.TokenRefused, match="not of the form") as e:
        tokens.consume(store, token, now=T0)
    assert e.value.reason is tokens.Refused.Malformed


def test_token_needs_a_lifetime_and_a_use(store: Store) -> None:
    """A token with no lifetime or no use is refused at creation, saying what to give."""
    with pytest.raises(LlmgwError, match="--ttl"):
        tokens.create_token(store, ttl_s=0, uses=1)
    with pytest.raises(LlmgwError, match="--uses"):
        tokens.create_token(store, ttl_s=60, uses=0)


def test_init_writes_owner_only_files_and_an_argon2_admin(tmp_path: Path) -> None:
    """init: dir and pki/ 0700, keys and db 0600, certs 0644; the CA signed the server cert; admin is argon2 only."""
    old = os.umask(0o022)
    try:
        done = datadir.init(tmp_path / "d", hosts=["cp1"])
    finally:
        os.umask(old)
    d = tmp_path / "d"
    assert _mode(d) == 0o700 and _mode(d / "pki") == 0o700 and _mode(d / "llmgw.db") == 0o600
    assert _mode(d / "pki" / "ca.key") == 0o600 and _mode(d / "pki" / "server.key") == 0o600
    assert _mode(d / "pki" / "ca.crt") == 0o644 and _mode(d / "pki" / "server.crt") == 0o644
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".pki-")) == []
    assert done.ca_hash == pki.ca_hash((d / "pki" / "ca.crt").read_bytes())
    assert pki.subject_alt_names((d / "pki" / "server.crt").read_bytes())[0] == "cp1"
    assert done.admin_password not in repr(done)
    store = Store.open(d)
    try:
        admin = store.get_user("admin")
    finally:
        store.close()
    assert admin is not None and admin.role == "admin" and admin.password_hash.startswith("$argon2id$")
    assert argon2.PasswordHasher().verify(admin.password_hash, done.admin_password)


def test_second_init_refuses_and_changes_nothing(tmp_path: Path) -> None:
    """A second init says 'already initialised at DIR' and leaves every file as it was."""
    d = tmp_path / "d"
    datadir.init(d, hosts=[])
    before = {p: p.read_bytes() for p in (d / "pki").iterdir()}
    with pytest.raises(LlmgwError, match=f"already initialised at {re.escape(str(d.resolve()))}; nothing was changed"):
        datadir.init(d, hosts=["other"])
    assert {p: p.read_bytes() for p in (d / "pki").iterdir()} == before


def test_private_file_is_created_0600_and_never_replaced(tmp_path: Path) -> None:
    """write_private makes a 0600 file even under umask 000, and refuses an existing file or a symlink."""
    old = os.umask(0)
    try:
        datadir.write_private(tmp_path / "k", b"secret")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "k") == 0o600
    with pytest.raises(FileExistsError):
        datadir.write_private(tmp_path / "k", b"other")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        datadir.write_private(tmp_path / "link", b"other")
    assert (tmp_path / "k").read_bytes() == b"secret" and not (tmp_path / "elsewhere").exists()


def test_owner_only_dir_tightens_an_existing_directory(tmp_path: Path) -> None:
    """A data directory that exists 0755 (made by an earlier `llmgw server`) is set 0700."""
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    datadir.owner_only_dir(d)
    assert _mode(d) == 0o700
