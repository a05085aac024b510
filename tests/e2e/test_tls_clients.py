"""Clients of an `llmgw server --tls` verify it, pinning the cluster CA (issue 28), all real processes over real TLS:

- `llmgw login --url https://… --ca-hash <right>` pins the CA; a later `llmgw get nodes` verifies with it;
- a wrong --ca-hash is refused with the sentence, and no password is sent (no login is audited);
- no terminal and no --ca-hash: refused, naming --ca-hash and --ca-file;
- the pinned context against a server of another CA (a second data directory) is refused naming both hashes
  and the re-pin command;
- a standalone router with --control-ca-hash follows the https:// control plane and serves a sim model; with a
  wrong hash it stops at start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.core import pki
from llmgw.testing import system as system_mod
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import System, sim_model

LLMGW = [sys.executable, "-m", "llmgw"]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with system_mod.running(tmp_path_factory.mktemp("tls-clients"), server_args=["--tls"], https=True) as s:
        yield s


class Cli:
    """`llmgw` as a user runs it: a config directory of its own, none of the test's LLMGW_* or SSL_* variables."""

    def __init__(self, root: Path) -> None:
        self.config = root / "cfg"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("LLMGW_", "SSL_", "REQUESTS_CA", "CURL_CA"))}
        self.env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(self.config))

    @property
    def file(self) -> Path:
        return self.config / "llmgw" / "credentials.json"

    def __call__(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        # stdin is a pipe, never a terminal: the [y/N] question is never asked here.
        return subprocess.run([*LLMGW, *args], env=self.env, input=stdin, capture_output=True, text=True, timeout=60)


def _logins(s: System) -> int:
    """How many login attempts the audit log holds (a refused client must have sent none)."""
    items = s.get("/api/v1/audit?limit=500")["items"]
    return sum(1 for e in items if e["action"] == "login")


def test_login_pins_the_right_hash_and_later_commands_verify_with_it(system: System, tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    r = cli("login", "--url", system.url, "--ca-hash", system.ca_hash, "--password-stdin",
            stdin=system.admin_password + "\n")
    assert r.returncode == 0, r.stderr
    assert f"logged in to {system.url} as admin" in r.stdout
    ctx = next(iter(json.loads(cli.file.read_text())["contexts"].values()))
    assert pki.ca_hash(ctx["ca"].encode()) == system.ca_hash  # the CA is stored in the context, 0600
    nodes = cli("get", "nodes")
    assert nodes.returncode == 0 and "node1" in nodes.stdout, nodes.stderr
    # Logging in again (an expired token) keeps the pinned CA and asks nothing.
    again = cli("login", "--password-stdin", stdin=system.admin_password + "\n")
    assert again.returncode == 0, again.stderr


def test_a_wrong_hash_is_refused_and_no_password_is_sent(system: System, tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    wrong = pki.ca_hash(pki.create_ca().cert_pem)
    before = _logins(system)
    r = cli("login", "--url", system.url, "--ca-hash", wrong, "--password-stdin", stdin=system.admin_password + "\n")
    assert r.returncode == 1
    assert f"offers a CA with hash {system.ca_hash}, not the --ca-hash {wrong} given: nothing was sent" in r.stderr
    assert not cli.file.exists()
    assert _logins(system) == before


def test_no_terminal_and_no_hash_is_refused_naming_the_flags(system: System, tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    before = _logins(system)
    r = cli("login", "--url", system.url, "--password-stdin", stdin=system.admin_password + "\n")
    assert r.returncode == 1
    assert "there is no terminal to confirm it: pass --ca-hash" in r.stderr and "--ca-file PATH" in r.stderr
    assert system.ca_hash in r.stderr
    assert _logins(system) == before


def test_a_pinned_context_meeting_another_ca_says_both_hashes_and_how_to_re_pin(system: System,
                                                                               tmp_path: Path) -> None:
    """The same URL later answered by a server of another cluster CA (its own data directory): refused."""
    cli = Cli(tmp_path)
    other = System(tmp_path / "other", server_args=["--tls"], https=True)
    try:
        other.start_server()
        r = cli("login", "--context", "c", "--url", other.url, "--ca-hash", other.ca_hash, "--password-stdin",
                stdin=other.admin_password + "\n")
        assert r.returncode == 0, r.stderr
        # Point the context at the first system (another CA) as if the server behind the URL were replaced.
        doc = json.loads(cli.file.read_text())
        doc["contexts"]["c"]["urls"] = [system.url]
        cli.file.write_text(json.dumps(doc))
        got = cli("get", "nodes")
    finally:
        other.close()
    assert got.returncode == 1
    assert f"pinned {other.ca_hash}, the server's CA is {system.ca_hash}" in got.stderr, got.stderr
    assert f"`llmgw login --context c --ca-hash {system.ca_hash}`" in got.stderr


def _router(system: System, tmp_path: Path, ca_hash: str, port: int, *, workers: int = 1) -> Proc:
    token = system.request("POST", "/api/v1/routers", json={"name": f"edge{port}"}).json()["token"]
    (tmp_path / f"router{port}.token").write_text(token + "\n")
    return Proc.start([*LLMGW, "router", "--control", system.url, "--control-ca-hash", ca_hash, "--port", str(port),
                       "--token-file", str(tmp_path / f"router{port}.token"), "--workers", str(workers),
                       "--log-level", "info"], log_path=tmp_path / f"router{port}.log")


@pytest.mark.parametrize("workers", [1, 2], ids=["one process", "a hub and two workers"])
def test_a_standalone_router_follows_the_https_control_plane_by_its_ca_hash(system: System, tmp_path: Path,
                                                                            workers: int) -> None:
    system.apply(sim_model("pinned"))
    system.wait_model("pinned")
    port = free_port()
    router = _router(system, tmp_path, system.ca_hash, port, workers=workers)
    try:
        body = {"model": "pinned", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}

        def served() -> bool:
            try:
                return httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                                  timeout=10).status_code == 200
            except httpx.ConnectError:
                return False
        wait_for(served, timeout=60, interval=0.2, what="the router serving from the https control plane")
        assert f"control plane CA {system.ca_hash} checked" in router.log_tail(200)
    finally:
        router.stop()


def test_a_standalone_router_with_a_wrong_hash_stops_at_start(system: System, tmp_path: Path) -> None:
    wrong = pki.ca_hash(pki.create_ca().cert_pem)
    router = _router(system, tmp_path, wrong, free_port())
    try:
        assert router.popen.wait(timeout=30) == 2
        said = router.log_tail(20)
        assert f"serves a CA with hash {system.ca_hash}, not the --control-ca-hash {wrong} given" in said
    finally:
        router.stop()


def test_the_readmes_recipes_openai_and_curl_trust_the_downloaded_ca(system: System, tmp_path: Path) -> None:
    """The CA downloaded from /api/v1/ca.crt (checked by its hash, as the README says) is what the `openai` client
    (http_client, or SSL_CERT_FILE) and curl (--cacert) verify with; without it they refuse the server."""
    import ssl

    import openai

    system.apply(sim_model("recipes"))
    system.wait_model("recipes")
    with httpx.Client(verify=False, trust_env=False, timeout=30) as unverified:  # noqa: S501 (checked below)
        pem = unverified.get(f"{system.url}/api/v1/ca.crt").content
    assert pki.ca_hash(pem) == system.ca_hash
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pem)
    messages = [{"role": "user", "content": "x"}]
    client = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(ca))))
    got = client.chat.completions.create(model="recipes", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    assert got.choices[0].message.content
    bare = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(trust_env=False))
    with pytest.raises(openai.APIConnectionError):
        bare.chat.completions.create(model="recipes", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    script = ("import openai; c = openai.OpenAI(api_key='unused', max_retries=0); "
              "print(c.chat.completions.create(model='recipes', max_tokens=2, "
              "messages=[{'role': 'user', 'content': 'x'}]).choices[0].message.content)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SSL_", "REQUESTS_CA", "OPENAI_"))}
    by_env = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={**env, "SSL_CERT_FILE": str(ca), "OPENAI_BASE_URL": f"{system.url}/v1"})
    assert by_env.returncode == 0 and by_env.stdout.strip(), by_env.stderr[-2000:]
    curl = subprocess.run(["curl", "-sS", "--cacert", str(ca), f"{system.url}/v1/models"], capture_output=True,
                          text=True, timeout=30)
    assert curl.returncode == 0 and "recipes" in curl.stdout, curl.stderr
    refused = subprocess.run(["curl", "-sS", f"{system.url}/v1/models"], capture_output=True, text=True, timeout=30,
                             env={**env, "CURL_CA_BUNDLE": ""})
    assert refused.returncode == 60, (refused.returncode, refused.stderr)  # curl's "peer certificate cannot be
    # authenticated with known CA certificates"


def _on_a_terminal(argv: list[str], env: dict[str, str], answers: list[tuple[str, str]]) -> tuple[int, str]:
    """Runs ``argv`` on a new pseudo-terminal (its controlling terminal: getpass reads it), answering each prompt
    that ends with the first of an ``answers`` pair with the second; its exit status and everything it wrote."""
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once, nothing else
        os.execvpe(argv[0], argv, env)
    out, pending = b"", list(answers)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            if pending and out.decode(errors="replace").rstrip().endswith(pending[0][0]):
                os.write(fd, pending.pop(0)[1].encode())
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_on_a_terminal_the_fingerprint_is_shown_and_yes_pins_it(system: System, tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    argv = [*LLMGW, "login", "--url", system.url]
    code, said = _on_a_terminal(argv, cli.env, [("Trust this CA? [y/N]", "y\n"), (":", system.admin_password + "\n")])
    assert code == 0, said
    assert system.ca_hash in said and "logged in to" in said
    ctx = next(iter(json.loads(cli.file.read_text())["contexts"].values()))
    assert pki.ca_hash(ctx["ca"].encode()) == system.ca_hash
    other = Cli(tmp_path / "no")
    code, said = _on_a_terminal(argv, other.env, [("Trust this CA? [y/N]", "n\n")])
    assert code == 1 and "the CA was not trusted; nothing was sent" in said, said
    assert not other.file.exists()
