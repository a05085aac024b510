"""A replica that spans nodes, end to end: three real agents, sim engines, a declared fabric.

This machine has no GPU and no InfiniBand adapter, so each agent reads them
from fixtures behind its injectable paths: its nvidia-smi is a script that
prints a captured ``nvidia-smi -q -x`` (two GPUs), and its sysfs root is the
captured ``/sys/class/infiniband`` of a node with two ACTIVE adapters. Two
agents declare those adapters cabled to fabric ib-a; the third declares none,
so it can never be a rank. What is checked is what the processes themselves
were given: their environment, as the kernel holds it, and what each sim rank
says in /sim/stats.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import System, sim_model

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SYSFS = FIXTURES / "sysfs" / "class" / "infiniband"
NVIDIA_SMI_XML = FIXTURES / "nvidia-smi-q-x-2gpu.xml"


def fake_nvidia_smi(path: Path) -> Path:
    """An executable that answers ``-q -x`` with the two-GPU fixture (a Python script: no shell)."""
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(NVIDIA_SMI_XML)!r}).read())\n")
    path.chmod(0o755)
    return path


def start_agent(s: System, node_id: str, smi: Path, *, fabric: str | None) -> Proc:
    """Like ``System.start_agent``, with the GPU and adapter fixtures, and a fabric when given."""
    env = {**os.environ, "LLMGW_AGENT_DISCOVERY__PREFER_NVML": "false",
           "LLMGW_AGENT_DISCOVERY__NVIDIA_SMI": str(smi), "LLMGW_AGENT_DISCOVERY__SYSFS_ROOT": str(SYSFS)}
    if fabric:
        env["LLMGW_AGENT_FABRICS"] = f'[{{"fabric": "{fabric}", "hcas": ["mlx5_0", "mlx5_1"]}}]'
    proc = Proc.start([*s.agent_command(node_id), "--heartbeat-interval", "1", "--stop-grace", "3"],
                      env=env, log_path=s.root / f"agent-{node_id}.log")
    s.agents[node_id] = proc  # System.close stops it and whatever engines it left
    wait_for(lambda: any(n["id"] == node_id and n["connected"] for n in s.get("/api/v1/nodes")["items"]),
             timeout=30, interval=0.1, what=f"agent {node_id} registered")
    return proc


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[System]:
    s = System(tmp_path)
    try:
        s.start_server()
        smi = fake_nvidia_smi(tmp_path / "nvidia-smi")
        start_agent(s, "node1", smi, fabric="ib-a")
        start_agent(s, "node2", smi, fabric="ib-a")
        start_agent(s, "node3", smi, fabric=None)
        yield s
    finally:
        s.close()


def engines_of(s: System, node_id: str) -> list[dict[str, Any]]:
    """Each engine process the node's agent runs: pid, environment, and its /sim/stats."""
    out = []
    for pid in sorted(s.engine_pids(node_id)):
        try:
            p = psutil.Process(pid)
            argv, env = p.cmdline(), p.environ()
        except psutil.NoSuchProcess:
            continue  # a short-lived child of the agent (its nvidia-smi, run every heartbeat), already gone
        if "llmgw.sim.engine" not in argv:
            continue
        port = int(argv[argv.index("--port") + 1])
        stats = httpx.get(f"http://127.0.0.1:{port}/sim/stats", timeout=5, trust_env=False).json()
        out.append({"pid": pid, "env": env, "port": port, "group": stats["group"]})
    return out


def test_a_two_node_replica_runs_one_rank_per_node_and_serves_from_the_leader(cluster: System) -> None:
    """Both ranks run with their rank env on the fabric's nodes, Ready at the leader's endpoint.

    A rank that dies takes the group down and it starts again whole; deleting the model stops both ranks.
    """
    s = cluster
    s.apply(sim_model("big", resources={"gpus": {"count": 1}, "nnodes": 2}))
    s.wait_model("big", timeout=60)
    (rep,) = s.replicas("big")
    # Either fabric node may lead (the one with more free memory does); node3, on no fabric, has no rank.
    assert rep["phase"] == "Ready" and rep["node"] in ("node1", "node2") and rep["shard"].endswith("-0")
    ranks = {n: engines_of(s, n) for n in ("node1", "node2", "node3")}
    assert [len(ranks[n]) for n in ("node1", "node2", "node3")] == [1, 1, 0]
    (leader,), (worker,) = ranks[rep["node"]], ranks["node2" if rep["node"] == "node1" else "node1"]
    assert rep["endpoint"] == f"http://127.0.0.1:{leader['port']}"
    for rank, e in enumerate((leader, worker)):
        env = e["env"]
        assert (env["LLMGW_NNODES"], env["LLMGW_RANK"], env["NCCL_IB_HCA"]) == ("2", str(rank), "mlx5_0,mlx5_1")
        assert env["LLMGW_SHARD_ID"] == f"{rep['shard'][:-2]}-{rank}"
        assert e["group"]["rank"] == rank and e["group"]["nnodes"] == 2
        assert e["group"]["env"]["LLMGW_RANK"] == str(rank)
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    # Every rank was told the same leader: its node's management address and a rendezvous port.
    assert leader["env"]["LLMGW_LEADER_ADDR"] == worker["env"]["LLMGW_LEADER_ADDR"] == "127.0.0.1"
    assert leader["env"]["LLMGW_LEADER_PORT"] == worker["env"]["LLMGW_LEADER_PORT"] == "29500"

    # Through the router, with the real client: served by the leader.
    s.wait_router("big", 1)
    c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=30)
    chat = c.chat.completions.create(model="big", messages=[{"role": "user", "content": "hello"}], max_tokens=3)
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    stats = httpx.get(f"http://127.0.0.1:{leader['port']}/sim/stats", timeout=5, trust_env=False).json()
    assert stats["completed"] >= 1
    # The worker rank serves no API of its own: only the leader does.
    refused = httpx.post(f"http://127.0.0.1:{worker['port']}/v1/chat/completions", timeout=5, trust_env=False,
                         json={"model": "big", "messages": [{"role": "user", "content": "x"}]})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "worker_rank"

    # A worker rank dies: the leader is stopped too, and the whole group starts again (attempt 2).
    psutil.Process(worker["pid"]).kill()
    wait_for(lambda: not alive(leader["pid"]), timeout=30, interval=0.2, what="the leader stopped with its worker")
    wait_for(lambda: [r["attempt"] for r in s.replicas("big") if r["phase"] == "Ready"] == [2], timeout=60,
             interval=0.2, what="the group Ready again")
    (rep,) = s.replicas("big")
    again = [e for n in ("node1", "node2") for e in engines_of(s, n)]
    assert sorted(e["env"]["LLMGW_RANK"] for e in again) == ["0", "1"]
    assert {e["env"]["LLMGW_SHARD_ID"] for e in again} == {rep["shard"], rep["shard"][:-1] + "1"}
    s.wait_router("big", 1)

    # Deleting the model drains the leader and stops both ranks.
    assert s.request("DELETE", "/api/v1/models/big").status_code == 200
    wait_for(lambda: not any(alive(e["pid"]) for e in again), timeout=30, interval=0.2, what="both ranks stopped")
    wait_for(lambda: s.replicas("big") == [], timeout=30, interval=0.2, what="the replica gone")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
