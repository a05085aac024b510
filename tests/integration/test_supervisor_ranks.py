"""Worker ranks that serve no HTTP, each shard's private work dir, the node's facts in the engine's env, and
the adapter's refusal before launch: real processes under a real supervisor.

A worker rank here is a small adapter of the test's own whose ``Launch`` says
``serves_http=False`` and runs ``python -c "import time; time.sleep(600)"``:
nothing listens, so a worker probed like a leader would never be READY. The
sim engine runs where an engine that serves HTTP is wanted.
"""

from __future__ import annotations

import asyncio
import json
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from llmgw.agent import engines
from llmgw.agent.engines import base
from llmgw.agent.supervisor import statefiles
from llmgw.core import enginecheck, inventory
from llmgw.core.shards import ShardSpec, ShardState
from llmgw.testing import procs, supervised
from llmgw.testing.supervised import LeavingHarness, harnesses

S = ShardState
pytestmark = pytest.mark.slow
SLEEP = "import time; time.sleep(600)"

Agent = LeavingHarness


class WorkerRank:
    """A rank that serves no HTTP: ``code`` run by python, its TMPDIR in the shard's work dir."""

    name, health_path = "sim", "/health"

    def __init__(self, code: str = SLEEP) -> None:
        self.code = code

    def validate(self, spec: ShardSpec, **kw: Any) -> None:
        pass

    def launch(self, spec: ShardSpec, *, work_dir: str = "", **kw: Any) -> engines.Launch:
        return engines.Launch(argv=[sys.executable, "-c", self.code], env={"TMPDIR": work_dir}, serves_http=False)

    def probe(self) -> str | None:
        return "test"

    def in_flight_probe(self) -> engines.InFlightProbe:
        # Never asked for a worker rank; were it asked, nothing answers and a drain would wait out its timeout.
        return "/sim/stats", lambda body: None


class SimWithFabric:
    """The sim adapter plus the collectives' variables the vLLM and SGLang adapters derive for a rank."""

    name, health_path = "sim", "/health"

    def validate(self, spec: ShardSpec, **kw: Any) -> None:
        engines.get("sim").validate(spec, **kw)

    def launch(self, spec: ShardSpec, *, node: enginecheck.NodeFacts = enginecheck.NodeFacts(),
               **kw: Any) -> engines.Launch:
        inner = engines.get("sim").launch(spec, node=node, **kw)
        return engines.Launch(argv=inner.argv, env={**inner.env, **base.multinode_env(spec, node)})

    def probe(self) -> str | None:
        return "test"


def registry(adapter: object) -> SimpleNamespace:
    return SimpleNamespace(get=lambda name, version="": adapter)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    with harnesses(tmp_path / "run", worker_settle_s=0.3) as make:
        yield make


def spec(shard_id: str, **kw: Any) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine="sim", served_name="m",
                     api_key="k", **kw)


def environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def until(predicate: Callable[[], bool], *, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_worker_rank_is_ready_once_alive_drains_at_once_and_its_work_dir_goes_with_it(
        agents: Callable[..., Agent], tmp_path: Path) -> None:
    """No HTTP is asked: READY after the settle time, DRAINED without waiting, work dir 0700 until the stop."""
    a = agents(adapters=registry(WorkerRank()))
    a.run(a.sup.start(spec("w")))
    ready = a.wait_state("w", S.READY)
    assert ready.message.startswith("worker rank is alive after ") and "serves no HTTP" in ready.message
    work = tmp_path / "run" / "w.d"
    assert environ(ready.pid)["TMPDIR"] == str(work)
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    assert statefiles.read(tmp_path / "run" / "w.json").serves_http is False
    drained = a.run(a.sup.drain("w", timeout_s=5))
    assert drained.state is S.DRAINED and drained.message.startswith("drained at once: a worker rank")
    stopped = a.run(a.sup.stop("w"))
    assert stopped.state is S.STOPPED and not psutil.pid_exists(ready.pid)
    assert not work.exists()
    # Only the work dir: the log stays for `llmgw logs`.
    assert (tmp_path / "run" / "w.log").exists()
    assert a.states("w") == [S.STARTING, S.READY, S.DRAINED, S.STOPPING, S.STOPPED]


def test_a_worker_rank_that_exits_at_once_is_failed_with_its_output(agents: Callable[..., Agent],
                                                                  tmp_path: Path) -> None:
    """A bad flag ends a rank within the settle time: FAILED with its exit code and last line, never READY."""
    code = "import sys; print('error: unrecognized arguments: --tp-size 3', flush=True); sys.exit(2)"
    a = agents(adapters=registry(WorkerRank(code)), worker_settle_s=2.0)
    a.run(a.sup.start(spec("w")))
    failed = a.wait_state("w", S.FAILED)
    assert failed.exit_code == 2
    assert failed.message == ("engine exited with code 2 before it was ready: error: unrecognized arguments: "
                              "--tp-size 3")
    assert failed.last_output == ("error: unrecognized arguments: --tp-size 3",)
    assert S.READY not in a.states("w")
    assert until(lambda: not (tmp_path / "run" / "w.d").exists())


def test_an_adopted_worker_rank_stays_ready_after_an_agent_restart(agents: Callable[..., Agent],
                                                                 tmp_path: Path) -> None:
    """The state file says it serves no HTTP, so the next agent judges it alive, not unanswering."""
    a = agents(adapters=registry(WorkerRank()))
    a.run(a.sup.start(spec("w")))
    ready = a.wait_state("w", S.READY)
    a.die()
    # Probed for HTTP, it would be given up on after adopt_timeout_s (and stopped), or go Unhealthy.
    b = agents(adapters=registry(WorkerRank()), adopt_timeout_s=0.5)
    [adopted] = b.run(b.sup.recover())
    assert (adopted.state, adopted.adopted, adopted.pid) == (S.STARTING, True, ready.pid)
    again = b.wait_state("w", S.READY)
    assert again.message.startswith("adopted worker rank is alive after ")
    b.run(asyncio.sleep(1.5))
    st = b.sup.status("w")
    assert st is not None and (st.state, st.pid, st.probe_failures) == (S.READY, ready.pid, 0)
    assert b.states("w") == [S.STARTING, S.READY]
    b.run(b.sup.stop("w"))
    assert not (tmp_path / "run" / "w.d").exists()


def test_a_work_dir_whose_engine_died_meanwhile_is_removed_at_recovery(agents: Callable[..., Agent],
                                                                     tmp_path: Path) -> None:
    """The engine died while no agent ran: its state file and its work dir go, another shard's stay."""
    a = agents(adapters=registry(WorkerRank()))
    a.run(a.sup.start(spec("dead")))
    a.run(a.sup.start(spec("alive")))
    dead, alive = a.wait_state("dead", S.READY), a.wait_state("alive", S.READY)
    a.die()
    psutil.Process(dead.pid).kill()
    assert until(lambda: psutil.Process(dead.pid).status() == psutil.STATUS_ZOMBIE
                 if psutil.pid_exists(dead.pid) else True)
    b = agents(adapters=registry(WorkerRank()))
    [adopted] = b.run(b.sup.recover())
    assert adopted.shard_id == "alive" and adopted.pid == alive.pid
    run = tmp_path / "run"
    assert not (run / "dead.d").exists() and not (run / "dead.json").exists()
    assert (run / "alive.d").is_dir() and (run / "dead.log").exists()


def test_a_rank_sees_its_nodes_interface_over_the_specs(agents: Callable[..., Agent]) -> None:
    """NCCL/GLOO_SOCKET_IFNAME are this node's management interface (from the facts), not the model file's."""
    roce = inventory.HcaPort(1, "ACTIVE", link_layer="Ethernet", roce_v2_gid_index=3)
    facts = enginecheck.NodeFacts(gpus=(inventory.Gpu(0, "GPU-0", "test", 0, 0),), mgmt_interface="enp3s0f0",
                                  hcas=(inventory.Hca("mlx5_0", ports=(roce,)),))
    a = agents(adapters=registry(SimWithFabric()), node=lambda: facts)
    rank0 = spec("r0", gpus=(0,), tensor_parallel=2, nnodes=2, rank=0, leader_addr="127.0.0.1",
                 leader_port=procs.free_port(), hcas=("mlx5_0",),
                 env=(("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_DEBUG", "INFO")))
    a.run(a.sup.start(rank0))
    env = environ(a.wait_state("r0", S.READY).pid)
    got = {k: env.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX",
                                    "NCCL_DEBUG", "LLMGW_RANK")}
    assert got == {"NCCL_SOCKET_IFNAME": "enp3s0f0", "GLOO_SOCKET_IFNAME": "enp3s0f0", "NCCL_IB_HCA": "mlx5_0",
                   "NCCL_IB_GID_INDEX": "3", "NCCL_DEBUG": "INFO", "LLMGW_RANK": "0"}


def _safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))


def test_a_profile_the_model_cannot_run_is_refused_before_anything_starts(agents: Callable[..., Agent],
                                                                        tmp_path: Path) -> None:
    """tensor_parallel 3 and a model of 32 heads (its config.json): FAILED with what to change, no process."""
    before = supervised.children()
    model = tmp_path / "models" / "llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 32, "num_key_value_heads": 8,
                                                   "hidden_size": 4096, "num_hidden_layers": 2}))
    _safetensors(model / "model.safetensors")
    three = tuple(inventory.Gpu(i, f"GPU-{i}", "test", 0, 0) for i in range(3))
    a = agents(node=lambda: enginecheck.NodeFacts(gpus=three))
    st = a.run(a.sup.start(spec("tp3", source=f"file://{model}", gpus=(0, 1, 2), tensor_parallel=3)))
    assert st.state is S.FAILED and st.pid == 0
    assert "tensor_parallel 3 does not divide 32 attention heads; use 1, 2, 4, 8, 16 or 32" in st.message
    assert supervised.children() <= before  # nothing started
    assert not (tmp_path / "run" / "tp3.d").exists() and not (tmp_path / "run" / "tp3.log").exists()
    # The same profile on a model whose heads it divides starts.
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 24, "num_key_value_heads": 3}))
    a.run(a.sup.start(spec("tp3-ok", source=f"file://{model}", gpus=(0, 1, 2), tensor_parallel=3)))
    assert a.wait_state("tp3-ok", S.READY).pid > 0
