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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

#: Probing every 0.5 s with a 0.5 s timeout, Unhealthy after 3 failures; replaced 5 s after that
#: (long enough for `llmgw get replicas`, a new Python process, to see it Unhealthy on a busy box).
AGENT_ENV = {"LLMGW_AGENT_PROBE_PERIOD_S": "0.5", "LLMGW_AGENT_PROBE_TIMEOUT_S": "0.5",
             "LLMGW_AGENT_PROBE_FAILURE_THRESHOLD": "3"}
GRACE_S = 5


class Load:
    """Clients sending completions through the router back to back; each failure kept with whether bytes came."""

    def __init__(self, url: str, model: str, *, clients: int = 6) -> None:
        self.url, self.model = url, model
        self.ok = {True: 0, False: 0}  # by streaming
        self.before_bytes: list[str] = []  # failed with no byte of an answer received: must be none
        self.after_bytes: list[str] = []  # a stream cut after bytes had come: counted apart
        self.slowest_s = 0.0  # the longest a request that was served took
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i % 2 == 0,), daemon=True)
                         for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)

    def served(self) -> int:
        return self.ok[True] + self.ok[False]

    def _count(self, stream: bool, failure: str | None, *, got_bytes: bool, took_s: float = 0.0) -> None:
        with self._lock:
            if failure is None:
                self.ok[stream] += 1
                self.slowest_s = max(self.slowest_s, took_s)
            elif got_bytes:
                self.after_bytes.append(f"{'stream' if stream else 'whole'}: {failure}")
            else:
                self.before_bytes.append(f"{'stream' if stream else 'whole'}: {failure}")

    def _run(self, stream: bool) -> None:
        body = {"model": self.model, "prompt": "x", "max_tokens": 8, "stream": stream}
        with httpx.Client(timeout=60, trust_env=False) as c:
            while not self._stop.is_set():
                got = b""
                started = time.monotonic()
                try:
                    with c.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                        for chunk in r.iter_raw():
                            got += chunk
                    text = got.decode("utf-8", "replace")
                    if r.status_code != 200:
                        failure: str | None = f"HTTP {r.status_code}: {text[:200]}"
                    elif stream:
                        lines = [x for x in text.splitlines() if x]
                        done = bool(lines) and lines[-1] == "data: [DONE]" and not any('"error"' in x for x in lines)
                        failure = None if done else f"stream cut: {lines[-2:]}"
                    else:
                        failure = None if '"text"' in text else f"no text: {text[:200]}"
                    # A status that is not 200 is an answer of no use: counted as no byte served.
                    self._count(stream, failure, got_bytes=r.status_code == 200 and bool(got),
                                took_s=time.monotonic() - started)
                except httpx.HTTPError as e:
                    self._count(stream, repr(e), got_bytes=bool(got))

    def wait_ok(self, n: int, *, timeout: float = 30) -> None:
        start = self.served()
        wait_for(lambda: self.served() >= start + n, timeout=timeout, what=f"{n} more requests served")


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    s = System(tmp_path, server_args=["--unhealthy-grace", str(GRACE_S)], agent_env=AGENT_ENV)
    try:
        s.start_server()
        s.start_agent("node1")
        yield s
    finally:
        s.close()


def _cli(system: System, *args: str) -> str:
    # Wide columns: rich would otherwise fold the message column of a table into many short lines.
    out = subprocess.run([*LLMGW, *args, "--url", system.url], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "400"})
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


def test_a_stopped_engine_is_found_replaced_and_killed_with_no_failed_request(system: System) -> None:
    """SIGSTOP one of two engines under load: Unhealthy, replaced, process gone, zero failures before a byte."""
    system.apply(sim_model("hang", replicas=2))
    system.wait_model("hang", timeout=60)
    system.wait_router("hang", 2)
    before = {r["id"]: r for r in system.replicas("hang")}
    victim = sorted(before)[0]
    pid = _shard_pid(system, before[victim]["shard"])
    assert pid in system.engine_pids("node1")  # one of this system's engines, nothing else's
    unhealthy_seen: dict[str, Any] = {}
    with Load(system.url, "hang") as load:
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
        served_before = load.served()
        load.wait_ok(30)  # and the two replicas serve on
    assert system.server is not None
    # The router says how many requests it gave up on the stopped engine and sent elsewhere.
    resent = sum(int(m) for m in re.findall(r"(\d+) requests waiting there for a first byte are sent elsewhere",
                                            system.server.log_path.read_text(errors="replace")))
    print(f"\nmeasured: Unhealthy {found_s:.1f}s after SIGSTOP, replaced and killed after {replaced_s:.1f}s; "
          f"served {load.ok[False]} whole and {load.ok[True]} streamed ({load.served() - served_before} after); "
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
    system.apply(sim_model("blip", replicas=2))
    system.wait_model("blip", timeout=60)
    system.wait_router("blip", 2)
    before = {r["id"]: r for r in system.replicas("blip")}
    victim = sorted(before)[0]
    pid = _shard_pid(system, before[victim]["shard"])
    assert pid in system.engine_pids("node1")
    with Load(system.url, "blip", clients=4) as load:
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
        wait_for(lambda: len(system.get("/api/v1/endpoints")["models"][0]["endpoints"]) == 2, timeout=10,
                 what="two endpoints")
        load.wait_ok(20)
    assert load.before_bytes == [] and load.after_bytes == [], (load.before_bytes, load.after_bytes)
    assert {r["id"] for r in system.replicas("blip")} == set(before)  # nothing was replaced
    assert not _gone(pid)
    told = [(e["reason"], e["object"]) for e in system.get("/api/v1/models/blip/describe")["events"]]
    assert ("Unhealthy", f"replica/{victim}") in told and ("Recovered", f"replica/{victim}") in told, told
    assert ("Replacing", f"replica/{victim}") not in told
