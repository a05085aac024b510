"""A whole llmgw on loopback for tests: a real server process and real agent processes.

Everything is started on free ports with its own data and state directories,
and everything is stopped at the end, engines included, even when the test
failed: the agent stops its engines on SIGTERM, and whatever is left of the
processes it started is killed by pid.

Secure by default, as a user runs it: the data directory is initialised (cluster CA, admin
password), the harness logs in as admin and sends that token on every REST call, and each agent
joins with a one-use token over the join port and then holds a mutual-TLS stream.
``secure=False`` runs the server and agents with ``--insecure`` (loopback development mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from llmgw.testing.procs import Proc, wait_for

LLMGW = [sys.executable, "-m", "llmgw"]


@contextlib.contextmanager
def running(root: Path, **kw: Any) -> Iterator[System]:
    """A server and one agent (node1) under ``root``, torn down whatever happens; ``kw`` as ``System`` takes."""
    s = System(root, **kw)
    try:
        s.start_server()
        s.start_agent("node1")
        yield s
    finally:
        s.close()


def sim_model(name: str, *, replicas: int = 1, args: list[str] | None = None,
              autoscale: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A sim model's manifest; with ``autoscale`` (the ``spec.autoscale`` mapping) ``replicas`` is left out.

    A manifest with both is refused (autoscale sets the count), so an autoscaled model never carries one.
    """
    count: dict[str, Any] = {"autoscale": dict(autoscale)} if autoscale is not None else {"replicas": replicas}
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
            "spec": {"engine": "sim", "served_name": name, **count,
                     "engine_args": args or ["--decode-tps", "400"], **spec}}


class System:
    def __init__(self, root: Path, *, node_grace_s: float = 30.0, server_args: Sequence[str] = (),
                 agent_env: Mapping[str, str] | None = None, secure: bool = True, database: str = "",
                 ca_from: Path | None = None, https: bool = False, ca_file: Path | None = None) -> None:
        """``server_args`` are added to `llmgw server`'s; ``agent_env`` to each agent's environment.

        ``database``: the store's URL (PostgreSQL), given to init and to the server (in LLMGW_DATABASE, as a
        URL with a password must be). ``ca_from``: another control plane of the same cluster, initialised with
        the first one's CA (its ``pki/`` directory); set ``token`` from the first before starting it.
        ``https``: the server's HTTP port speaks TLS (``server_args`` say how); the harness verifies it with
        ``ca_file`` (default: the cluster CA, ``DATA_DIR/pki/ca.crt``).
        """
        self.https = https
        self._ca_file = ca_file
        self.root = root
        self.database = database
        self.ca_from = ca_from
        self.data_dir = root / "data"
        self.node_grace_s = node_grace_s
        self.server_args = tuple(server_args)
        self.agent_env = dict(agent_env or {})
        self.secure = secure
        self.server: Proc | None = None
        self.agents: dict[str, Proc] = {}
        self._engine_pids: set[int] = set()
        self.http_port = self.agent_port = self.join_port = 0
        #: Secure mode: the first administrator's password (from init), the CA's hash, and the admin's API token.
        self.admin_password = ""
        self.ca_hash = ""
        self.token = ""

    # -- processes ------------------------------------------------------------------
    def start_server(self) -> None:
        ports = self.root / "ports.json"
        ports.unlink(missing_ok=True)
        if self.secure:
            self._init()
        mode = ["--join-port", str(self.join_port)] if self.secure else ["--insecure"]
        self.server = Proc.start([*LLMGW, "server", "--http-port", str(self.http_port), "--agent-port",
                                  str(self.agent_port), *mode, "--data-dir", str(self.data_dir), "--ports-file",
                                  str(ports), "--node-grace", str(self.node_grace_s), *self.server_args],
                                 log_path=self.root / "server.log",
                                 env={**os.environ, "LLMGW_DATABASE": self.database} if self.database else None)
        got = wait_for(lambda: ports.exists() and ports.read_text(), timeout=30, what="server ports file")
        doc = json.loads(str(got))
        self.http_port, self.agent_port = doc["http_port"], doc["agent_port"]
        self.join_port = int(doc.get("join_port") or 0)
        self.server.wait_http(f"{self.url}/healthz", timeout=30, context=self.ssl_context())
        if self.secure and not self.token:
            resp = self.request("POST", "/api/v1/login", json={"username": "admin", "password": self.admin_password})
            assert resp.status_code == 200, f"login as admin: {resp.status_code} {resp.text}"
            self.token = str(resp.json()["token"])

    def _init(self) -> None:
        """``llmgw init`` of the data directory, once (in-process: it is a few file writes and one argon2 hash)."""
        from llmgw.control import datadir
        from llmgw.core import pki

        if datadir.is_initialised(self.data_dir):
            return
        done = datadir.init(self.data_dir, hosts=[], database=self.database, ca_from=self.ca_from)
        self.admin_password = done.admin_password or self.admin_password
        self.ca_hash = pki.ca_hash(datadir.read_ca(self.data_dir).cert_pem)

    def join_token(self, *, node: str = "", uses: int = 1, ttl_s: float = 600.0) -> str:
        """A bootstrap token, as `llmgw token create` makes one (straight into the store, which the server shares)."""
        from llmgw.control import datadir, tokens

        store = datadir.open_store(self.data_dir, self.database)
        try:
            token_id, secret = tokens.create_token(store, ttl_s=ttl_s, uses=uses, node_name=node)
        finally:
            store.close()
        return f"{token_id}.{secret}"

    def join_args(self, node_id: str, *, token: str = "") -> list[str]:
        """``llmgw agent join``'s flags for ``node_id`` with a fresh one-use token (or ``token``)."""
        return ["--server", f"127.0.0.1:{self.join_port}", "--token", token or self.join_token(),
                "--ca-hash", self.ca_hash]

    def cli_env(self) -> dict[str, str]:
        """The environment for a `llmgw` CLI process talking to this system: the admin's token in LLMGW_TOKEN."""
        env = dict(os.environ)
        if self.token:
            env["LLMGW_TOKEN"] = self.token
        return env

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop(timeout=10)
            self.server = None

    def agent_command(self, node_id: str, *, state_dir: Path | None = None) -> list[str]:
        """The argv that starts (secure: first joins) agent ``node_id``; append the agent's other flags."""
        state = state_dir or self.root / node_id
        if not self.secure:
            how = ["agent", "--insecure", "--server", f"127.0.0.1:{self.agent_port}"]
        elif (state / "pki").exists():  # joined before: its certificate, and the agent port (it may be new)
            how = ["agent", "--server", f"127.0.0.1:{self.agent_port}"]
        else:
            how = ["agent", "join", *self.join_args(node_id)]
        return [*LLMGW, *how, "--node-id", node_id, "--state-dir", str(state)]

    def start_agent(self, node_id: str = "node1") -> Proc:
        proc = Proc.start([*self.agent_command(node_id), "--heartbeat-interval", "1", "--stop-grace", "3"],
                          log_path=self.root / f"agent-{node_id}.log",
                          env={**os.environ, **self.agent_env} if self.agent_env else None)
        self.agents[node_id] = proc
        wait_for(lambda: any(n["id"] == node_id and n["connected"] for n in self.get("/api/v1/nodes")["items"]),
                 timeout=30, interval=0.1, what=f"agent {node_id} registered")
        return proc

    def engine_pids(self, node_id: str = "node1") -> set[int]:
        """Engine processes the agent runs now (its children)."""
        proc = self.agents[node_id]
        try:
            kids = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            kids = set()
        self._engine_pids |= kids
        return kids

    def stop_agent(self, node_id: str = "node1") -> None:
        proc = self.agents.pop(node_id, None)
        if proc is not None:
            self.engine_pids_of(proc)
            proc.stop(timeout=15)

    def kill_agent(self, node_id: str = "node1") -> None:
        """SIGKILL the agent (no cleanup of its own, as a crash or the OOM killer leaves it); its engines live on."""
        proc = self.agents.pop(node_id, None)
        if proc is not None:
            self.engine_pids_of(proc)
            proc.signal(signal.SIGKILL)
            proc.stop(timeout=5)   # reaps it and closes its log; nothing is left to signal

    def engine_pids_of(self, proc: Proc) -> None:
        try:
            self._engine_pids |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def close(self) -> None:
        for node_id in list(self.agents):
            self.stop_agent(node_id)
        self.stop_server()
        # Engines outlive their agents by design, so the last step is ours:
        # every process started for one of this system's state directories
        # (agents mark their engines with LLMGW_RUN_DIR), and the pids seen
        # as agents' children. Nothing else is touched.
        root = str(self.root.resolve())
        for p in psutil.process_iter(["pid"]):
            try:
                run_dir = p.environ().get("LLMGW_RUN_DIR", "")
            except psutil.Error:
                continue
            if run_dir.startswith(root + "/"):
                self._engine_pids.add(p.pid)
        for pid in self._engine_pids:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass

    # -- the API -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{'https' if self.https else 'http'}://127.0.0.1:{self.http_port}"

    @property
    def ca_file(self) -> Path:
        """What the harness trusts for an ``https`` server: the given CA file, else the cluster CA."""
        return self._ca_file or self.data_dir / "pki" / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context trusting ``ca_file`` for an ``https`` server; None for a plain one."""
        return ssl.create_default_context(cafile=str(self.ca_file)) if self.https else None

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A REST call as the admin (its token sent unless ``headers`` says otherwise)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        kw["headers"] = {**headers, **kw.get("headers", {})}
        with httpx.Client(base_url=self.url, timeout=30, trust_env=False, verify=self.ssl_context() or True) as c:
            return c.request(method, path, **kw)

    def get(self, path: str) -> Any:
        resp = self.request("GET", path)
        resp.raise_for_status()
        return resp.json()

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        resp = self.request("POST", "/api/v1/models", json=doc)
        assert resp.status_code in (200, 201), resp.text
        return dict(resp.json())

    def model_status(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/models/{name}")["status"])

    def wait_model(self, name: str, state: str = "Ready", *, timeout: float = 30) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = self.model_status(name)
            return st if st["state"] == state else None
        try:
            return dict(wait_for(check, timeout=timeout, interval=0.1, what=f"{name} {state}"))  # type: ignore[arg-type]
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last: {self.model_status(name)}") from None

    def replicas(self, model: str) -> list[dict[str, Any]]:
        return list(self.get(f"/api/v1/replicas?model={model}")["items"])

    def wait_router(self, name: str, endpoints: int, *, timeout: float = 10) -> None:
        """Until the router's table has ``endpoints`` endpoints for ``name`` (it follows the control plane)."""
        def check() -> bool:
            r = self.request("POST", "/v1/chat/completions", json={"model": name, "messages": [
                {"role": "user", "content": "x"}], "max_tokens": 1})
            return r.status_code == 200 if endpoints else r.status_code == 503
        wait_for(check, timeout=timeout, interval=0.1, what=f"router has {name}")
        time.sleep(0.1)
