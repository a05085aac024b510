"""A hung engine on the whole system: found by its agent's probe, left by the router, replaced, killed.

A real server (control plane and router) and agent, a model with two sim
replicas under constant load through the router (streaming and not, several
clients, a 60 s client timeout as a patient client has). One engine is stopped
with SIGSTOP: its process lives and its port still accepts connections, so
only a probe that asks it something finds it. What must hold:

* the replica is reported Unhealthy (REST and `llmgw get replicas`), a
  replacement is started and becomes Ready, and the stopped process is gone;
* no request that had received no byte fails: those waiting on the stopped
  engine are re-sent to the other replica. A stream that had bytes when the
  engine stopped cannot be re-sent; such failures are counted apart (they
  are the streams cut when the hung engine is killed), and there are none
  for non-streaming requests;
* `llmgw describe model` tells the story: the Unhealthy reason and the
  replacement in its events.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from typing import Any

import psutil
import pytest

from llmgw.core import skew
from llmgw.testing.load import Load
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

#: Probing every 0.5 s with a 0.5 s timeout, Unhealthy after 3 failures; replaced 5 s after that
#: (long enough for `llmgw get replicas`, a new Python process, to see it Unhealthy on a busy box).
AGENT_ENV = {"LLMGW_AGENT_PROBE_PERIOD_S": "0.5", "LLMGW_AGENT_PROBE_TIMEOUT_S": "0.5",
             "LLMGW_AGENT_PROBE_FAILURE_THRESHOLD": "3"}
GRACE_S = 5


@pytest.fixture
def system_args() -> dict[str, Any]:
    """The shared ``system`` fixture's server and agents, with a short grace and fast probes."""
    return {"server_args": ["--unhealthy-grace", str(GRACE_S)], "agent_env": AGENT_ENV}


def _cli(system: System, *args: str) -> str:
    # Wide columns: rich would otherwise fold the message column of a table into many short lines.
    out = subprocess.run([*LLMGW, *args, "--url", system.url], capture_output=True, text=True, timeout=60,
                         env={**system.cli_env(), "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def _shard_pid(system: System, shard: str) -> int:
    for n in system.get("/api/v1/nodes")["items"]:
        for s in n["shard_states"]:
            if s["id"] == shard and s["pid"]:
                return int(s["pid"])
    raise AssertionError(f"no pid reported for shard {shard}")


def _gone(pid: int) -> bool:
    """No such process: killed and reaped by its agent (a zombie would still be found)."""
    try:
        psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return False


def _two_replicas_and_a_victim(system: System, model: str) -> tuple[dict[str, Any], str, int]:
    """Two sim replicas of ``model`` Ready and routed: each replica by id, the one to stop, and its engine's pid."""
    system.apply(sim_model(model, replicas=2))
    system.wait_model(model, timeout=60)
    system.wait_router(model, 2)
    before = {r["id"]: r for r in system.replicas(model)}
    victim = sorted(before)[0]
    pid = _shard_pid(system, before[victim]["shard"])
    assert pid in system.engine_pids("node1")  # one of this system's engines, nothing else's
    return before, victim, pid


def test_a_stopped_engine_is_found_replaced_and_killed_with_no_failed_request(system: System) -> None:
    """SIGSTOP one of two engines under load: Unhealthy, replaced, process gone, zero failures before a byte."""
    before, victim, pid = _two_replicas_and_a_victim(system, "hang")
    unhealthy_seen: dict[str, Any] = {}
    with Load(system.url, "hang", clients=6, timeout_s=60) as load:
        load.wait_ok(30)
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            def unhealthy() -> dict[str, Any] | None:
                mine = {r["id"]: r for r in system.replicas("hang")}.get(victim)
                return mine if mine is not None and mine["phase"] == "Unhealthy" else None

            unhealthy_seen = dict(wait_for(unhealthy, timeout=20, interval=0.05,  # type: ignore[arg-type]
                                           what=f"replica {victim} Unhealthy"))
            found_s = time.monotonic() - stopped_at
            listed = _cli(system, "get", "replicas", "--model", "hang")
            replacement = wait_for(lambda: next((r for r in system.replicas("hang") if r["id"] not in before
                                                 and r["phase"] == "Ready"), None),
                                   timeout=40, interval=0.1, what="a replacement Ready")
            wait_for(lambda: _gone(pid), timeout=30, interval=0.1, what=f"stopped engine {pid} gone")
            replaced_s = time.monotonic() - stopped_at
            wait_for(lambda: victim not in {r["id"] for r in system.replicas("hang")}, timeout=20, interval=0.1,
                     what=f"replica {victim} removed")
        finally:
            if not _gone(pid):  # never leave a stopped process behind, whatever failed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        served_before = load.ok
        load.wait_ok(30)  # and the two replicas serve on
    assert system.server is not None
    # The router says how many requests it gave up on the stopped engine and sent elsewhere.
    resent = sum(int(m) for m in re.findall(r"(\d+) requests waiting there for a first byte are sent elsewhere",
                                            system.server.log_path.read_text(errors="replace")))
    print(f"\nmeasured: Unhealthy {found_s:.1f}s after SIGSTOP, replaced and killed after {replaced_s:.1f}s; "
          f"served {load.ok - load.streamed} whole and {load.streamed} streamed ({load.ok - served_before} after); "
          f"re-sent by the router: {resent}; slowest served request {load.slowest_s:.1f}s; "
          f"failed before any byte: {len(load.before_bytes)}, streams cut after bytes: {len(load.after_bytes)} "
          f"{[f[-160:] for f in load.after_bytes[:3]]}")
    assert resent >= 1  # requests were waiting on it when it stopped: they are the ones this is about
    # Re-sent once the probe failed, not left to wait for the kill: without the re-send they are
    # answered only when the killed engine's connections close (and with production settings,
    # 6 s of probes + a 30 s grace + a replacement's start + the stop grace, after a 60 s client
    # timeout). Half the time to the kill leaves room for a slow CI box either way.
    assert load.slowest_s < replaced_s / 2, (load.slowest_s, replaced_s)
    assert load.before_bytes == [], load.before_bytes[:5]
    assert not [f for f in load.after_bytes if f.startswith("whole")], load.after_bytes[:5]
    assert len(load.after_bytes) <= 3, load.after_bytes  # at most one stream per streaming client was on it

    assert "unhealthy on node node1" in unhealthy_seen["message"] or "health probe" in unhealthy_seen["message"]
    row = next((line for line in listed.splitlines() if victim in line), "")
    assert "Unhealthy" in row and "node1" in row, listed
    described = system.get("/api/v1/models/hang/describe")
    told = [(e["reason"], e["object"], e["message"]) for e in described["events"]]
    mine = [(reason, msg) for reason, obj, msg in told if obj == f"replica/{victim}"]
    # Each step told: out of routing at the first failed probe, then Unhealthy with the agent's reason.
    assert any(reason == "Unhealthy" and f"replica {victim} health probe failing on node node1" in msg
               for reason, msg in mine), mine
    assert any(reason == "Unhealthy" and f"replica {victim} unhealthy on node node1: " in msg
               and "health probe failed 3/3" in msg for reason, msg in mine), mine
    assert any(reason == "Replacing" and f"replacing unhealthy replica {victim}" in msg for reason, msg in mine), mine
    assert any(reason == "Terminating" and "its replacement is Ready" in msg for reason, msg in mine), mine
    assert any(obj == f"replica/{replacement['id']}" and reason == "Ready" for reason, obj, _ in told), told  # type: ignore[index]
    shown = _cli(system, "describe", "model", "hang")
    assert "Unhealthy" in shown and "Replacing" in shown and f"replacing unhealthy replica {victim}" in shown, shown


def test_an_engine_that_answers_again_before_its_grace_is_kept_and_routed(system: System) -> None:
    """SIGSTOP then SIGCONT within the grace: Unhealthy, then Ready again (Recovered); nothing replaced or failed."""
    before, victim, pid = _two_replicas_and_a_victim(system, "blip")
    # The endpoints document is served to router credentials only.
    router = system.request("POST", "/api/v1/routers", json={"name": "hung-test"}).json()["token"]

    def routes() -> dict:
        return dict(system.request("GET", "/api/v1/endpoints", headers=as_router(router)).json())

    with Load(system.url, "blip", clients=4, timeout_s=60) as load:
        load.wait_ok(20)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: {r["id"]: r["phase"] for r in system.replicas("blip")}.get(victim) == "Unhealthy",
                     timeout=20, interval=0.05, what=f"replica {victim} Unhealthy")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: {r["id"]: r["phase"] for r in system.replicas("blip")}.get(victim) == "Ready",
                 timeout=20, interval=0.05, what=f"replica {victim} Ready again")
        # Back in the router's table: both replicas answer again.
        wait_for(lambda: len(routes()["models"][0]["endpoints"]) == 2, timeout=10,
                 what="two endpoints")
        load.wait_ok(20)
    assert load.before_bytes == [] and load.after_bytes == [], (load.before_bytes, load.after_bytes)
    assert {r["id"] for r in system.replicas("blip")} == set(before)  # nothing was replaced
    assert not _gone(pid)
    told = [(e["reason"], e["object"]) for e in system.get("/api/v1/models/blip/describe")["events"]]
    assert ("Unhealthy", f"replica/{victim}") in told and ("Recovered", f"replica/{victim}") in told, told
    assert ("Replacing", f"replica/{victim}") not in told


def as_router(token: str) -> dict[str, str]:
    """A router's headers for the endpoints document: its credential and this release's protocol."""
    return {"Authorization": f"Bearer {token}", **skew.headers()}
