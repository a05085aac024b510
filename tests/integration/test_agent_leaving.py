"""An agent's lifecycle at its edges, on a real secure server and real agents (issue 24).

A unit file's `agent join` restarted on a joined node runs the agent; a revoked node stops redialling
and exits with the commands that let it back in; a stopping agent leaves no engine behind and is sent
no start while it leaves.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.agent import rejoin
from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import System, sim_model


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    s = System(tmp_path, agent_env={"LLMGW_AGENT_RECONNECT_MAX": "1"})
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def _connected(s: System, node_id: str) -> bool:
    return any(n["id"] == node_id and n["connected"] for n in s.get("/api/v1/nodes")["items"])


def _shard_processes(root: Path) -> dict[int, str]:
    """Every process on this machine whose environment marks it an engine of a state directory under ``root``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        run_dir = env.get(b"LLMGW_RUN_DIR", b"").decode(errors="replace")
        if b"LLMGW_SHARD_ID" in env and run_dir.startswith(str(root.resolve()) + "/"):
            found[int(entry.name)] = env[b"LLMGW_SHARD_ID"].decode(errors="replace")
    return found


def test_agent_join_on_a_joined_state_directory_runs_the_agent(system: System, tmp_path: Path) -> None:
    """`agent join` again (a unit file's restart, its token long used) says it has joined and runs the agent."""
    argv = [*system.agent_command("n1"), "--heartbeat-interval", "0.5"]
    token = argv[argv.index("--token") + 1]
    first = system.agents["n1"] = Proc.start(argv, log_path=tmp_path / "agent-n1-first.log")
    wait_for(lambda: _connected(system, "n1"), timeout=30, what="n1 joined and connected")
    system.stop_agent("n1")
    wait_for(lambda: not _connected(system, "n1"), timeout=30, what="n1 gone")
    assert first.poll() is not None

    # The same command line, as systemd's Restart=always runs it: the one-use token is spent.
    again = system.agents["n1"] = Proc.start(argv, log_path=tmp_path / "agent-n1-again.log")
    wait_for(lambda: _connected(system, "n1"), timeout=30, what="n1 back with its certificate")
    assert again.poll() is None
    log = again.log_tail(200)
    assert log.count("this node has already joined as node n1") == 1, log
    assert "the token is ignored; running the agent" in log, log
    assert token not in log


def test_a_revoked_agent_backs_off_and_exits_with_the_commands_to_rejoin(system: System) -> None:
    """Revoked while connected, the agent is refused ROUNDS rounds in a row, discovers its hardware at most
    once more (not on every redial), and exits with status 3 naming `llmgw token create --node` and join."""
    agent = system.start_agent("n1")
    system.engine_pids("n1")
    resp = system.request("POST", "/api/v1/nodes/n1/revoke")
    assert resp.status_code == 200, resp.text
    code = wait_for(lambda: agent.poll(), timeout=60, what="the revoked agent exits")
    log = agent.log_tail(400)
    assert code == rejoin.EXIT_CODE, log
    assert log.count("refused this node's certificate") >= rejoin.ROUNDS, log
    assert "was revoked at" in log
    assert "on the control plane run `llmgw token create --node n1`" in log, log
    assert f"move {system.root / 'n1' / 'pki'} aside and run the `llmgw agent join" in log, log
    # One discovery at the start, at most one for the first redial after the stream ended; none after.
    assert log.count("this node: adapters") <= 2, log


def test_a_stopping_agent_leaves_no_engine_and_is_sent_no_start(tmp_path: Path) -> None:
    """SIGTERM (Ctrl-C on `make up`) to an agent that stops its engines, with a two-replica model on it: no
    engine outlives it (by pid and by the LLMGW_SHARD_ID marker), and the control plane, told the node is
    leaving, sends it no start once its stop began; the model waits for another node instead."""
    s = System(tmp_path, agent_env={"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "1"})
    try:
        s.start_server()
        agent = s.start_agent("n1")
        s.apply(sim_model("two", replicas=2))
        s.wait_model("two", timeout=60)
        pids = s.engine_pids("n1")
        shards = _shard_processes(tmp_path)
        assert len(shards) == 2, shards
        agent.signal(signal.SIGTERM)
        assert wait_for(lambda: agent.poll() is not None, timeout=60, what="the agent stops")
        s.agents.pop("n1")
        log = (tmp_path / "agent-n1.log").read_text()
        assert "agent stopping: stopping 2 engines" in log, log
        after = log.split("agent stopping: stopping", 1)[1]
        assert "start shard" not in after and "refused to start" not in after, after
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and _not_zombie(p)]
        assert alive == [], alive
        assert _shard_processes(tmp_path) == {}
        wait_for(lambda: any(e["reason"] == "NodeLeaving" for e in s.get("/api/v1/events?node=n1")["items"]),
                 timeout=10, what="the NodeLeaving event")
        # Nothing was placed anywhere else either (there is no other node): the stopped replicas wait.
        assert all(r["phase"] == "Pending" for r in s.replicas("two")), s.replicas("two")
    finally:
        s.close()


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
