"""``llmgw init`` and ``llmgw token create`` as a person runs them: real processes on a temporary data directory."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

from llmgw.core import pki
from llmgw.testing.system import LLMGW


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # HOME and XDG_* inside tmp_path, so nothing the command might write by default lands outside what we grep.
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "xdg"),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def _modes(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): stat.S_IMODE(p.stat().st_mode) for p in sorted(d.rglob("*"))}


def test_init_prints_the_password_once_and_writes_it_nowhere(tmp_path: Path) -> None:
    """init prints the admin password once; no file under the temp dir holds it; files are 0600/0644, dirs 0700."""
    d = tmp_path / "data"
    r = _run(tmp_path, "init", "--data-dir", str(d), "--host", "cp1.example", "--host", "10.1.2.3")
    assert r.returncode == 0, r.stderr
    found = re.findall(r"^password \(shown once, not stored; keep it now\): (\S+)$", r.stdout, re.M)
    assert len(found) == 1 and len(found[0]) >= 20
    password = found[0]
    assert (r.stdout + r.stderr).count(password) == 1
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert d / "llmgw.db" in files and d / "pki" / "ca.key" in files
    for p in files:
        assert password.encode() not in p.read_bytes(), p
    modes = _modes(d)
    assert modes == {**{k: 0o600 for k in modes if k.endswith((".key", ".db", "-wal", "-shm", "database.json"))},
                     "pki": 0o700, "pki/ca.crt": 0o644, "pki/server.crt": 0o644}, modes
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    ca_hash = pki.ca_hash((d / "pki" / "ca.crt").read_bytes())
    assert f"cluster CA: {ca_hash}" in r.stdout


def test_second_init_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """A second init exits 1 with 'already initialised at DIR', prints no password, leaves the files as they were."""
    d = tmp_path / "data"
    assert _run(tmp_path, "init", "--data-dir", str(d)).returncode == 0
    before = {p: (p.read_bytes(), p.stat().st_mode) for p in (d / "pki").iterdir()}
    again = _run(tmp_path, "init", "--data-dir", str(d), "--host", "other")
    assert again.returncode == 1
    assert f"already initialised at {d.resolve()}; nothing was changed" in again.stderr
    assert "password" not in again.stdout + again.stderr
    assert {p: (p.read_bytes(), p.stat().st_mode) for p in (d / "pki").iterdir()} == before


def test_token_create_prints_a_join_command_with_the_ca_hash(tmp_path: Path) -> None:
    """token create prints `llmgw agent join` with the first --host, a kubeadm-shaped token and the CA's hash."""
    d = tmp_path / "data"
    before_init = _run(tmp_path, "token", "create", "--data-dir", str(d))
    assert before_init.returncode == 1 and "not initialised; run `llmgw init" in before_init.stderr
    assert _run(tmp_path, "init", "--data-dir", str(d), "--host", "cp1.example").returncode == 0
    r = _run(tmp_path, "token", "create", "--data-dir", str(d), "--ttl", "30m", "--uses", "2", "--node", "gpu7")
    assert r.returncode == 0, r.stderr
    ca_hash = pki.ca_hash((d / "pki" / "ca.crt").read_bytes())
    m = re.fullmatch(r"llmgw agent join --server cp1\.example:8082 --token ([a-z0-9]{6})\.([a-z0-9]{16}) "
                     rf"--ca-hash {ca_hash}\n", r.stdout)
    assert m, r.stdout
    bad = _run(tmp_path, "token", "create", "--data-dir", str(d), "--ttl", "soon")
    assert bad.returncode == 1 and "--ttl" in bad.stderr
