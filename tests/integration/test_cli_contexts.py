"""Named contexts on a real secure server: two users side by side, a cluster whose first URL is down,
and a credentials file of the old shape (issue 24)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing.procs import free_port
from llmgw.testing.system import System

LLMGW = [sys.executable, "-m", "llmgw"]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("contexts"))
    try:
        s.start_server()
        yield s
    finally:
        s.close()


class Cli:
    """`llmgw` as a user runs it: its own config directory, no LLMGW_TOKEN/URL/CONTEXT from the test's environment."""

    def __init__(self, root: Path) -> None:
        self.config = root / "cfg"
        self.env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_TOKEN", "LLMGW_URL", "LLMGW_CONTEXT")}
        self.env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(self.config))

    @property
    def file(self) -> Path:
        return self.config / "llmgw" / "credentials.json"

    def __call__(self, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*LLMGW, *args], env={**self.env, **env}, input=stdin, capture_output=True, text=True,
                              timeout=60)


def test_two_users_of_one_cluster_in_two_contexts_and_switching(system: System, tmp_path: Path) -> None:
    """admin and a viewer logged in side by side (the second login no longer replaces the first); the current
    context, `--context` anywhere on the line, and LLMGW_CONTEXT each pick who a command runs as."""
    cli = Cli(tmp_path)
    r = cli("login", "--context", "ops", "--url", system.url, "--password-stdin", stdin=system.admin_password + "\n")
    assert r.returncode == 0 and "context ops (current" in r.stdout, r.stderr
    made = cli("user", "create", "vera", "--role", "viewer")
    assert made.returncode == 0, made.stderr
    vera_password = made.stdout.strip().splitlines()[-1]
    # No --url: a new context for another user of the current context's cluster.
    r = cli("login", "--context", "vera", "-u", "vera", "--password-stdin", stdin=vera_password + "\n")
    assert r.returncode == 0 and "as vera (role viewer)" in r.stdout, r.stderr

    assert cli("user", "list").returncode == 1  # vera is current: a viewer may not list users
    assert "needs admin" in cli("user", "list").stderr
    assert cli("user", "list", "--context", "ops").returncode == 0  # after the verb, as kubectl takes it
    assert cli("--context", "ops", "user", "list").returncode == 0
    assert cli("user", "list", LLMGW_CONTEXT="ops").returncode == 0
    assert cli("context", "use", "ops").returncode == 0
    assert cli("user", "list").returncode == 0
    assert cli("user", "list", LLMGW_CONTEXT="vera").returncode == 1
    listed = cli("context", "list").stdout.splitlines()
    assert listed[0].split() == ["CURRENT", "NAME", "USER", "URLS"]
    assert listed[1].split() == ["*", "ops", "admin", system.url] and listed[2].split() == ["vera", "vera", system.url]

    doc = json.loads(cli.file.read_text())
    assert doc["current_context"] == "ops"
    tokens = {c["user"]: c["token"] for c in doc["contexts"].values()}
    assert set(tokens) == {"admin", "vera"} and all(tokens.values()) and tokens["admin"] != tokens["vera"]
    assert stat.S_IMODE(cli.file.stat().st_mode) == 0o600 and stat.S_IMODE(cli.file.parent.stat().st_mode) == 0o700

    unknown = cli("get", "models", "--context", "nope")
    assert unknown.returncode == 1 and "there is no context 'nope'" in unknown.stderr, unknown.stderr
    assert cli("logout", "--context", "vera").returncode == 0
    assert cli("user", "list").returncode == 0  # ops is untouched by vera's logout
    gone = cli("get", "models", LLMGW_CONTEXT="vera")
    assert gone.returncode == 1 and "llmgw login --context vera" in gone.stderr, gone.stderr
    assert cli("context", "delete", "vera").returncode == 0
    assert [line.split()[1] for line in cli("context", "list").stdout.splitlines()[1:]] == ["ops"]


def test_a_context_whose_first_control_plane_is_down_still_works(system: System, tmp_path: Path) -> None:
    """A context of two URLs, the first refusing connections: login and every command reach the second."""
    cli = Cli(tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    r = cli("login", "--context", "ha", "--url", f"{dead},{system.url}", "--password-stdin",
            stdin=system.admin_password + "\n")
    assert r.returncode == 0, r.stderr
    got = cli("get", "models")
    assert got.returncode == 0, got.stderr
    assert f"the control plane at {dead} did not answer; {system.url} did" in got.stderr
    assert json.loads(cli.file.read_text())["contexts"]["ha"]["urls"] == [dead, system.url]
    # Both down: one sentence naming both.
    cli("context", "delete", "ha")
    other = f"http://127.0.0.1:{free_port()}"
    r = cli("login", "--context", "gone", "--url", dead, "--url", other, "--password-stdin", stdin="x\n")
    assert r.returncode == 1 and f"cannot reach the control plane at {dead}, {other}" in r.stderr, r.stderr


def test_an_old_credentials_file_is_read_and_migrated_on_the_first_write(system: System, tmp_path: Path) -> None:
    """A file of the old shape ({URL: {token, user}}) still logs commands in, is listed as a context named
    by host:port, and is written in the new shape (0600) at the first change."""
    cli = Cli(tmp_path)
    cli.file.parent.mkdir(parents=True, mode=0o700)
    cli.file.write_text(json.dumps({system.url: {"token": system.token, "user": "admin"}}))
    cli.file.chmod(0o600)
    name = system.url.removeprefix("http://")
    assert cli("get", "models", "--url", system.url).returncode == 0
    listed = cli("context", "list").stdout.splitlines()
    assert listed[1].split() == [name, "admin", system.url], listed
    assert json.loads(cli.file.read_text()) == {system.url: {"token": system.token, "user": "admin"}}  # only read
    assert cli("context", "use", name).returncode == 0
    doc = json.loads(cli.file.read_text())
    assert doc["version"] == 2 and doc["current_context"] == name
    assert doc["contexts"][name] == {"urls": [system.url], "user": "admin", "token": system.token}
    assert stat.S_IMODE(cli.file.stat().st_mode) == 0o600
    assert cli("user", "list").returncode == 0
