"""Cordon, drain and uncordon on the whole system; conditions and events of a failing engine.

Cordon and drain marks live in the store, so a control plane restart keeps
them (and, as ever, reloads no engine); a drain under load fails no request.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from llmgw.testing.load import Load
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    # Wide: Rich wraps a table to 80 columns without a terminal, and a wrapped cell splits the words checked.
    return subprocess.run([*LLMGW, *args, "--url", system.url], capture_output=True, text=True, timeout=60,
                          env={**system.cli_env(), "COLUMNS": "300"})


def _node(system: System, node_id: str) -> dict[str, object]:
    return next(n for n in system.get("/api/v1/nodes")["items"] if n["id"] == node_id)


def test_cordon_survives_restart_and_drain_moves_replicas_without_failing_requests(tmp_path: Path) -> None:
    """Cordon keeps new replicas off a node across a restart; drain moves its replica under load; uncordon ends it."""
    s = System(tmp_path)
    try:
        s.start_server()
        s.start_agent("node1")
        s.start_agent("node2")
        doc = sim_model("cd", replicas=2)
        s.apply(doc)
        s.wait_model("cd")
        assert sorted(r["node"] for r in s.replicas("cd")) == ["node1", "node2"]

        out = _cli(s, "cordon", "node2")
        assert out.returncode == 0 and "node/node2 cordoned (Ready,SchedulingDisabled)" in out.stdout, out
        assert _cli(s, "cordon", "nope").returncode == 1

        pids = s.engine_pids("node1") | s.engine_pids("node2")
        s.stop_server()
        s.start_server()
        wait_for(lambda: all(n["connected"] for n in s.get("/api/v1/nodes")["items"]), timeout=30, interval=0.2,
                 what="agents reconnected")
        s.wait_model("cd")
        assert _node(s, "node2")["status"] == "Ready,SchedulingDisabled"
        assert s.engine_pids("node1") | s.engine_pids("node2") == pids  # the restart reloaded nothing

        doc["spec"]["replicas"] = 3
        s.apply(doc)
        s.wait_model("cd")
        assert sorted(r["node"] for r in s.replicas("cd")) == ["node1", "node1", "node2"]
        s.wait_router("cd", 3)

        with Load(s.url, "cd") as load:
            load.wait_ok(30)
            out = _cli(s, "drain", "node2")
            assert out.returncode == 0 and "Draining" in out.stdout, out
            wait_for(lambda: [r["node"] for r in s.replicas("cd") if r["phase"] == "Ready"] == ["node1"] * 3
                     and len(s.replicas("cd")) == 3, timeout=60, interval=0.2, what="node2's replica moved")
            s.wait_router("cd", 3)
            load.wait_ok(30)
        assert load.failures == [], load.failures[:5]
        print(f"\nmeasured: drain of node2 under load: {load.ok} requests ok, {len(load.failures)} failed")
        wait_for(lambda: _node(s, "node2")["status"] == "Ready,SchedulingDisabled", timeout=10, what="drained")
        table = _cli(s, "get", "nodes")
        assert "Ready,SchedulingDisabled" in table.stdout
        events = _cli(s, "events", "--node", "node2")
        for reason in ("NodeCordoned", "NodeDraining", "NodeDrained", "Terminating"):
            assert reason in events.stdout, events.stdout
        none = _cli(s, "events", "--model", "no-such-model")
        assert none.returncode == 0 and none.stdout == "" and "no events for model 'no-such-model'" in none.stderr
        described = _cli(s, "describe", "node", "node2")
        assert described.returncode == 0 and "SchedulingDisabled" in described.stdout

        assert "(Ready)" in _cli(s, "uncordon", "node2").stdout
        doc["spec"]["replicas"] = 4
        s.apply(doc)
        s.wait_model("cd")
        assert "node2" in [r["node"] for r in s.replicas("cd")]
    finally:
        s.close()


def test_failing_engine_shows_in_conditions_and_events(system: System) -> None:
    """An engine that exits at once: the replica is Degraded with the engine's output; a Warning event says so."""
    system.apply(sim_model("bad", args=["--no-such-flag"]))

    def degraded() -> dict[str, object] | None:
        reps = system.get("/api/v1/models/bad/describe")["replicas"]
        conds = {c["type"]: c for c in reps[0]["conditions"]} if reps else {}
        d = conds.get("Degraded")
        return d if d and d["status"] == "True" else None

    d = wait_for(degraded, timeout=30, interval=0.2, what="Degraded condition")
    assert d["reason"] in ("Failing", "CrashLoop") and "unrecognized arguments" in str(d["message"]), d  # type: ignore[index]
    model = {c["type"]: c for c in system.get("/api/v1/models/bad/describe")["conditions"]}
    assert model["Ready"]["status"] == "False" and model["Degraded"]["status"] == "True"
    events = system.get("/api/v1/events?model=bad")["items"]
    failed = [e for e in events if e["reason"] in ("Failed", "CrashLoop")]
    assert failed and failed[0]["kind"] == "Warning" and failed[0]["node"] == "node1"
    out = _cli(system, "describe", "model", "bad")
    assert "Degraded" in out.stdout and "unrecognized arguments" in out.stdout


def test_events_follow_prints_new_events_as_they_come(system: System) -> None:
    """`llmgw events -f --node node1` prints what is already there, then a cordon made after it started."""
    from llmgw.testing.procs import Proc

    log = Path(str(system.root)) / "events.log"
    with Proc.start([*LLMGW, "events", "-f", "--node", "node1", "--url", system.url], log_path=log,
                    env=system.cli_env()):
        wait_for(lambda: "NodeRegistered" in log.read_text(), timeout=30, interval=0.2, what="old events")
        assert "NodeCordoned" not in log.read_text()
        assert _cli(system, "cordon", "node1").returncode == 0
        wait_for(lambda: "NodeCordoned" in log.read_text(), timeout=10, interval=0.2, what="new event followed")
    assert log.read_text().count("NodeRegistered") == 1  # each event once, not again on every poll
