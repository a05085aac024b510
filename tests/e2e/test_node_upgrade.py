"""`llmgw node upgrade` against real processes: a real server, a real agent with a running sim replica, and a
wheelhouse on 127.0.0.1 holding llmgw built from this working tree at another version (this tree's, .post1) with its
dependencies (``llmgw.testing.llmgwwheel``; the dependencies are downloaded once and kept in test-artifacts/).

The agent installs that llmgw into a venv of its own, checks it, and re-executes itself into it: the same pid,
now running the new venv's Python; the node registers again reporting it; the engine is the same
process, adopted, and the router serves it throughout. A version the index lacks fails with pip's reason and
leaves the old agent connected with its old version; with ``--all`` the command stops at that node and the next
(node2) is never asked. ``--all`` later passes over node1 (at the version) and upgrades node2 after it. An agent
started again from the old command line resumes the release it was upgraded to. The agent runs with
``--stop-engines-on-exit`` (as under `llmgw up`): an upgrade keeps the engines all the same.

Measured on the shared 2-core machine: the wheel builds in ~4 s, the dependencies download once in ~10 s
(then reused from test-artifacts/), the agent's install (venv with pip, 66 wheels) takes 10-50 s with the
load, and the re-exec with the engine's adoption under 1 s; the test takes 35-90 s in all.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmgw.core.version import version
from llmgw.testing import llmgwwheel, wheelhouse
from llmgw.testing import system as system_mod
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

pytestmark = pytest.mark.timeout(600)
#: A release after this tree's (the wheel built from it says so), and one the index does not have.
NEW = f"{version()}.post1"
MISSING = f"{version()}.post2"


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    wh = llmgwwheel.wheelhouse(tmp_path_factory.mktemp("llmgw-wheelhouse"), NEW)
    with wheelhouse.serve(wh, log_path=wh.parent / "http.log") as url:
        yield url


@pytest.fixture
def cluster(tmp_path: Path, index_url: str) -> Iterator[System]:
    # --stop-engines-on-exit too (`llmgw up`'s): the re-exec must keep the engines all the same.
    with system_mod.running(tmp_path, server_args=["--engine-index", index_url, "--engine-find-links"],
                            agent_env={"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "true"}) as s:
        yield s


class Traffic:
    """Chat completions through the router, back to back, in a thread: every answer that is not 200 is kept."""

    def __init__(self, s: System, model: str) -> None:
        self.s, self.model = s, model
        self.ok, self.failed = 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.s.url, timeout=10, trust_env=False,
                          headers={"Authorization": f"Bearer {self.s.token}"}) as c:
            while not self._stop.is_set():
                try:
                    r = c.post("/v1/chat/completions", json={"model": self.model, "max_tokens": 2,
                                                             "messages": [{"role": "user", "content": "hi"}]})
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                time.sleep(0.05)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def _upgrade(s: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMGW, "node", "upgrade", *args, "--url", s.url, "--ready-timeout", "120"],
                          capture_output=True, text=True, timeout=400, env=s.cli_env(), check=False)


def _node(s: System, node: str = "node1") -> dict[str, Any]:
    return dict(s.get(f"/api/v1/nodes/{node}"))


def test_an_agent_upgrades_in_place_keeping_its_engine_and_a_missing_version_fails_leaving_it(
        cluster: System) -> None:
    s = cluster
    old = version()
    assert _node(s)["agent_version"] == old
    s.apply(sim_model("up"))
    s.wait_model("up", timeout=60)
    s.wait_router("up", 1, timeout=30)
    agent_pid = s.agents["node1"].pid
    engines = s.engine_pids("node1")
    assert engines
    shard_pids = {sh["id"]: sh["pid"] for sh in _node(s)["shard_states"]}
    assert shard_pids and set(shard_pids.values()) <= engines
    s.start_agent("node2")  # after the replica is placed on node1

    # A version the index lacks: FAILED with pip's reason; the old agent stays, connected, at its version, and
    # --all stops at that first node: node2 is never asked.
    failed = _upgrade(s, "--all", "--version", MISSING)
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert f"upgrading node node1 to llmgw {MISSING} failed" in failed.stderr, failed.stderr
    assert "stopped there: node2 not upgraded" in failed.stderr, failed.stderr
    assert _node(s, "node2")["upgrade"] is None
    assert "pip install exited" in failed.stderr and MISSING in failed.stderr, failed.stderr
    assert "no matching distribution" in failed.stderr.lower() or "could not find" in failed.stderr.lower()
    node = _node(s)
    assert node["agent_version"] == old and node["connected"] is True
    assert node["upgrade"]["state"] == "failed"
    assert not (s.root / "node1" / "llmgw" / MISSING).exists()  # the half-made venv is removed
    assert Path(f"/proc/{agent_pid}/cmdline").read_bytes().split(b"\0")[0] != b""
    listed = subprocess.run([*LLMGW, "get", "nodes", "--url", s.url], capture_output=True, text=True, timeout=60,
                            env={**s.cli_env(), "COLUMNS": "300"}, check=False)
    assert f"upgrade to {MISSING} failed" in listed.stdout, listed.stdout

    # The release the index holds: installed, checked, re-executed into, engines adopted, traffic served throughout.
    with Traffic(s, "up") as traffic:
        began = time.monotonic()
        done = _upgrade(s, "node1", "--version", NEW)
        print(f"llmgw node upgrade to {NEW}: {time.monotonic() - began:.1f} s to the node Ready at it; "
              f"{traffic.ok} requests served meanwhile")
        time.sleep(1)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"node/node1 runs llmgw {NEW}" in done.stdout, done.stdout
    # The steps, as the CLI polled them: which of pip's (resolving, downloading, installing) it catches depends on
    # how fast pip is from the local wheelhouse, and the restart can pass between two polls; an install step and
    # the end are always there.
    assert "installing: " in done.stdout and "done: running llmgw" in done.stdout, done.stdout
    new_python = s.root / "node1" / "llmgw" / NEW / "bin" / "python"
    argv = Path(f"/proc/{agent_pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0].decode() == str(new_python), argv  # the same process, now the new venv's Python
    assert b"-I" in argv and b"agent" in argv, argv
    node = _node(s)
    assert node["agent_version"] == NEW and node["connected"] is True, node
    assert node["upgrade"]["state"] == "done"
    assert s.engine_pids("node1") >= engines  # the engine kept running (its pid unchanged), adopted
    assert {sh["id"]: sh["pid"] for sh in node["shard_states"]} == shard_pids
    log = (s.root / "agent-node1.log").read_text()
    assert "re-executing into it (the engines keep running)" in log
    assert "adopted 1 engines a previous agent left running" in log
    # --stop-engines-on-exit is set, and the way out of an upgrade kept the engine all the same.
    assert "its 1 engines keep serving and the next agent adopts them" in log and "stopping 1 engines" not in log
    assert traffic.ok > 0 and not traffic.failed, (traffic.ok, traffic.failed[:5])
    described = subprocess.run([*LLMGW, "describe", "node", "node1", "--url", s.url], capture_output=True,
                               text=True, timeout=60, env={**s.cli_env(), "COLUMNS": "300"}, check=False)
    assert f"upgraded to {NEW}" in described.stdout, described.stdout
    audited = [(e["action"], e["object"], e["outcome"]) for e in s.get("/api/v1/audit")["items"]]
    assert ("upgrade", "node/node1", "ok") in audited, audited
    events = s.get("/api/v1/events?node=node1")["items"]
    reasons = {e["reason"] for e in events}
    assert {"NodeUpgrading", "NodeUpgraded", "NodeUpgradeFailed"} <= reasons, reasons
    # `llmgw node upgrade --all`: node1 runs the version already and is passed over; node2 is upgraded after it.
    again = _upgrade(s, "--all", "--version", NEW)
    assert again.returncode == 0, again
    out = again.stdout
    assert f"node/node1: done: already runs llmgw {NEW}; nothing sent" in out, out
    assert out.index("node/node1: done") < out.index("node/node2: sent") < out.index(f"node/node2 runs llmgw {NEW}")
    assert _node(s, "node2")["agent_version"] == NEW
    # The new agent serves commands: a second replica starts on it.
    s.request("POST", "/api/v1/models/up/scale", json={"replicas": 2})
    wait_for(lambda: sum(1 for r in s.replicas("up") if r["phase"] == "Ready") == 2, timeout=60,
             what="a replica started by the upgraded agent")
    # The adopted engine is stopped by the new agent, and reaped: it is this same process's child.
    assert s.request("DELETE", "/api/v1/models/up").status_code in (200, 202, 204)
    wait_for(lambda: not s.replicas("up"), timeout=60, what="the replicas gone")
    wait_for(lambda: not any(p.pid in engines for p in psutil.Process(agent_pid).children()), timeout=30,
             what="the adopted engine gone and reaped (no zombie left)")
    # The upgrade outlasts the process: the agent started again as before (the older llmgw's command line, as a
    # unit file would after a reboot) re-executes into the release it was upgraded to.
    s.stop_agent("node1")
    restarted = s.start_agent("node1")
    assert _node(s)["agent_version"] == NEW
    assert Path(f"/proc/{restarted.pid}/cmdline").read_bytes().split(b"\0")[0].decode() == str(new_python)
