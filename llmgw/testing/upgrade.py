"""The parts of a cluster the rolling-upgrade test starts, each run by the release it is given.

A control plane, an agent and a standalone router are each a real process of one release's venv
(``llmgw.testing.releases``): stopped and started again by another release on the same data directory or state
directory, which is what an upgrade does. A control plane's ports are chosen at its first start and kept, so one
restarted on the new release is where the agents, routers and the other control plane expect it; a router's are
chosen each time it starts (a new router beside the old is how this test upgrades one).

Secrets stay off argv: the database URL goes in ``LLMGW_DATABASE``, a join token in ``LLMGW_JOIN_TOKEN``, a
router's credential in a 0600 file (``--token-file``); the administrator's password, which ``llmgw init`` prints
once, is read from its captured output and used only to log in.

Engines outlive their agents (that is the point of the upgrade), so ``engine_pids`` finds them by the marker
every engine carries (``LLMGW_RUN_DIR`` under the agent's state directory), and ``kill_engines`` ends exactly
those at the end of a test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.releases import Release

#: A short lease, so a failover takes seconds here (tests/e2e/test_failover.py uses the same).
LEASE = ("--lease", "2s", "--lease-renew", "0.25s")
#: A node's grace: longer than any part of the upgrade leaves an agent away, so nothing is rescheduled.
NODE_GRACE_S = 60.0
_PASSWORD = re.compile(r"^password \(shown once[^:]*\): (\S+)$", re.M)


class ControlPlane:
    """``llmgw server`` on a data directory of its own and a shared PostgreSQL database, fixed ports."""

    def __init__(self, name: str, root: Path, database: str, *, ca_from: Path | None = None) -> None:
        self.name = name
        self.root = root
        self.database = database
        self.ca_from = ca_from
        self.data_dir = root / name / "data"
        #: Chosen at the first start (a port chosen long before its use may be taken meanwhile), kept after.
        self.http_port = self.agent_port = self.join_port = 0
        self.proc: Proc | None = None
        self.release: Release | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def agent_addr(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    @property
    def join_addr(self) -> str:
        return f"127.0.0.1:{self.join_port}"

    def init(self, release: Release) -> str:
        """``llmgw init`` by ``release``; the first administrator's password ("" when the database had users)."""
        args = ["init", "--data-dir", str(self.data_dir)]
        if self.ca_from is not None:
            args += ["--ca-from", str(self.ca_from)]
        out = release.run(*args, env=self._db_env()).stdout
        found = _PASSWORD.search(out)
        return found.group(1) if found else ""

    def start(self, release: Release) -> Proc:
        """``llmgw server`` of ``release`` on this data directory and these ports, answering /healthz."""
        self._starts += 1
        self.release = release
        if not self.http_port:
            self.http_port, self.agent_port, self.join_port = free_port(), free_port(), free_port()
        argv = release.argv("server", "--http-port", str(self.http_port), "--agent-port", str(self.agent_port),
                            "--join-port", str(self.join_port), "--data-dir", str(self.data_dir),
                            "--node-grace", str(NODE_GRACE_S), *LEASE)
        self.proc = Proc.start(argv, env=release.env(self._db_env()), cwd=release.venv,
                               log_path=self.root / f"{self.name}-{self._starts}-{release.version}.log")
        self.proc.wait_http(f"{self.url}/healthz", timeout=60)
        return self.proc

    def _db_env(self) -> dict[str, str]:
        """The database in the environment (a URL may hold a password); none: SQLite in the data directory."""
        return {"LLMGW_DATABASE": self.database} if self.database else {}

    def stop(self) -> int | None:
        """SIGTERM (then SIGKILL after 20 s); the exit code."""
        proc, self.proc = self.proc, None
        return proc.stop(timeout=20) if proc is not None else None


class Api:
    """The REST API of whichever control plane is asked, as the administrator (a standby forwards writes)."""

    def __init__(self, token: str = "") -> None:
        self.token = token

    def login(self, cp: ControlPlane, password: str) -> None:
        got = httpx.post(f"{cp.url}/api/v1/login", json={"username": "admin", "password": password}, timeout=30)
        assert got.status_code == 200, f"login as admin: {got.status_code} {got.text}"
        self.token = str(got.json()["token"])

    def request(self, cp: ControlPlane, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        with httpx.Client(base_url=cp.url, timeout=30, trust_env=False) as c:
            return c.request(method, path, headers=headers, **kw)

    def get(self, cp: ControlPlane, path: str) -> Any:
        got = self.request(cp, "GET", path)
        assert got.status_code == 200, f"GET {path} on {cp.name}: {got.status_code} {got.text[:300]}"
        return got.json()

    def post(self, cp: ControlPlane, path: str, doc: dict[str, Any]) -> Any:
        got = self.request(cp, "POST", path, json=doc)
        assert got.status_code in (200, 201), f"POST {path} on {cp.name}: {got.status_code} {got.text[:300]}"
        return got.json()

    # -- what the tests wait for ------------------------------------------------------------------------------
    def roles(self, cp: ControlPlane) -> dict[str, tuple[str, str]]:
        """Each control plane's http_url → (role, version), as ``cp`` reads them from the database."""
        try:
            doc = self.get(cp, "/api/v1/controlplanes")
        except (httpx.HTTPError, AssertionError):
            return {}
        return {str(c["http_url"]): (str(c["role"]), str(c.get("version") or "")) for c in doc["controlplanes"]}

    def leads(self, leader: ControlPlane, standby: ControlPlane, version: str = "") -> bool:
        """Whether ``leader`` leads and ``standby`` stands by (each at ``version`` when given), as both see it."""
        for cp in (leader, standby):
            seen = self.roles(cp)
            want = {leader.url: "leader", standby.url: "standby"}
            if {url: seen.get(url, ("", ""))[0] for url in want} != want:
                return False
            if version and any(seen[url][1] != version for url in want):
                return False
        return True

    def nodes(self, cp: ControlPlane) -> dict[str, dict[str, Any]]:
        return {str(n["id"]): n for n in self.get(cp, "/api/v1/nodes")["items"]}

    def model_ready(self, cp: ControlPlane, name: str) -> bool:
        try:
            return bool(self.get(cp, f"/api/v1/models/{name}")["status"]["state"] == "Ready")
        except (httpx.HTTPError, AssertionError):
            return False

    def events(self, cp: ControlPlane, *, node: str = "", obj: str = "") -> list[dict[str, Any]]:
        """The events ``cp`` lists, of ``node`` (and its replicas) or of the object ``obj`` when given."""
        query = "&".join(f"{k}={v}" for k, v in (("node", node), ("object", obj)) if v)
        return list(self.get(cp, "/api/v1/events" + (f"?{query}" if query else ""))["items"])


class Agent:
    """``llmgw agent`` for one node: a state directory of its own, joined once, started by any release."""

    def __init__(self, node: str, root: Path, *, model_dirs: Sequence[Path] = ()) -> None:
        self.node = node
        self.root = root
        self.state_dir = root / node
        self.model_dirs = tuple(model_dirs)
        self.proc: Proc | None = None
        self.release: Release | None = None
        self._starts = 0

    def join(self, release: Release, cp: ControlPlane, token: str, ca_hash: str) -> None:
        """``llmgw agent join --join-only`` by ``release`` (the token in the environment, not on argv)."""
        release.run("agent", "join", "--server", cp.join_addr, "--ca-hash", ca_hash, "--node-id", self.node,
                    "--state-dir", str(self.state_dir), "--join-only", env={"LLMGW_JOIN_TOKEN": token})

    def start(self, release: Release, servers: Sequence[ControlPlane]) -> Proc:
        """The agent of ``release`` on this state directory, told of every control plane; it adopts what runs."""
        self._starts += 1
        self.release = release
        argv = release.argv("agent", *(a for cp in servers for a in ("--server", cp.agent_addr)), "--node-id",
                            self.node, "--state-dir", str(self.state_dir), "--heartbeat-interval", "1")
        env = {"LLMGW_AGENT_MODEL_DIRS": os.pathsep.join(str(d) for d in self.model_dirs)} if self.model_dirs else {}
        self.proc = Proc.start(argv, env=release.env(env), cwd=release.venv,
                               log_path=self.root / f"agent-{self.node}-{self._starts}-{release.version}.log")
        return self.proc

    def stop(self) -> int | None:
        """SIGTERM, as systemd stops it: the agent exits, its engines run on (they are in sessions of their own)."""
        proc, self.proc = self.proc, None
        return proc.stop(timeout=20) if proc is not None else None

    def engine_pids(self) -> set[int]:
        """Every live process an agent of this state directory started (engines and whatever they forked)."""
        return engine_pids(self.state_dir)


class Router:
    """``llmgw router`` following every control plane with its own credential: ``workers`` processes (1: one
    process serving; more: a hub and that many workers on one port, the default on a machine of that many cores)."""

    def __init__(self, name: str, root: Path, token_file: Path, *, workers: int = 1) -> None:
        """``name`` is also its ``--router-id`` (two routers on one host would both be the hostname)."""
        self.name = name
        self.workers = workers
        self.root = root
        self.token_file = token_file
        self.port = 0  # chosen when it starts
        self.proc: Proc | None = None
        self.release: Release | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, release: Release, controls: Sequence[ControlPlane]) -> Proc:
        self.release = release
        self.port = free_port()
        argv = release.argv("router", "--control", ",".join(cp.url for cp in controls), "--port", str(self.port),
                            "--token-file", str(self.token_file), "--workers", str(self.workers), "--router-id",
                            self.name, "--log-level", "info")
        self.proc = Proc.start(argv, env=release.env(), cwd=release.venv,
                               log_path=self.root / f"router-{self.name}-{release.version}.log")
        return self.proc

    def serves(self, model: str) -> bool:
        """Whether a chat completion of ``model`` through this router is answered 200 now."""
        body = {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        try:
            return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_serving(self, *models: str, timeout: float = 60) -> None:
        """Until it serves each of ``models``; a router that exited says why (the end of its log)."""
        proc = self.proc
        assert proc is not None, f"router {self.name} was not started"
        for model in models:
            wait_for(lambda m=model: self.serves(m) or proc.poll() is not None,  # type: ignore[misc]
                     timeout=timeout, interval=0.2, what=f"router {self.name} serving {model}")
            assert proc.poll() is None, f"router {self.name} exited:\n{proc.log_tail(20)}"

    def stop(self, *, timeout: float = 40) -> int | None:
        """SIGTERM: it stops listening and lets open requests finish (``--graceful-shutdown``, 30 s); the exit code."""
        proc, self.proc = self.proc, None
        return proc.stop(timeout=timeout) if proc is not None else None


def write_secret(path: Path, secret: str) -> Path:
    """``secret`` in a file only its owner reads (a router's ``--token-file``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def engine_pids(under: Path) -> set[int]:
    """Live processes whose ``LLMGW_RUN_DIR`` (the marker every engine carries) is under ``under``."""
    root = str(Path(under).resolve())
    found: set[int] = set()
    for p in psutil.process_iter(["pid"]):
        try:
            run_dir = p.environ().get("LLMGW_RUN_DIR", "")
        except psutil.Error:
            continue
        if run_dir == root or run_dir.startswith(root + "/"):
            found.add(p.pid)
    return found


def kill_engines(under: Path) -> None:
    """SIGKILL the engines started under ``under``: found by their marker, so no reused pid is signalled."""
    for pid in engine_pids(under):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
