"""GPU assignment on the node: real sim engines, and the environment the kernel says they were started with.

This machine has no GPU; the node's GPU indices are what discovery would have
reported (the ``node`` facts' GPUs), and what is checked is the engine process's own
environment (``/proc/PID/environ``), which is what CUDA reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from llmgw.agent.supervisor import statefiles
from llmgw.core import enginecheck, inventory
from llmgw.core.shards import ShardSpec, ShardState
from llmgw.testing import supervised
from llmgw.testing.supervised import LeavingHarness, harnesses

S = ShardState
pytestmark = pytest.mark.slow
FOUR_GPUS = (0, 1, 2, 3)


Agent = LeavingHarness


def facts(*indices: int) -> enginecheck.NodeFacts:
    """What discovery would report on a node with these GPUs."""
    return enginecheck.NodeFacts(gpus=tuple(inventory.Gpu(i, f"GPU-{i}", "test", 0, 0) for i in indices))


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    with harnesses(tmp_path / "run") as make:
        yield make


def spec(shard_id: str, *, gpus: tuple[int, ...] = (), env: tuple[tuple[str, str], ...] = ()) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine="sim", served_name="m",
                     api_key="k", gpus=gpus, env=env, tensor_parallel=max(1, len(gpus)))


def environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def test_an_engine_sees_exactly_its_gpus_in_order_and_none_sees_none(
        agents: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_VISIBLE_DEVICES is the spec's gpus, comma-joined in order, over the spec's env and the agent's own."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the agent's own: must not leak into an engine
    a = agents(node=lambda: facts(*FOUR_GPUS))
    a.run(a.sup.start(spec("two", gpus=(2, 0), env=(("CUDA_VISIBLE_DEVICES", "3"), ("X", "1")))))
    a.run(a.sup.start(spec("cpu")))
    two, cpu = a.wait_state("two", S.READY), a.wait_state("cpu", S.READY)
    env = environ(two.pid)
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env["X"]) == ("2,0", "PCI_BUS_ID", "1")
    # Given no GPU on a node that has four: hidden from all of them.
    assert environ(cpu.pid)["CUDA_VISIBLE_DEVICES"] == ""


def test_a_node_without_gpus_leaves_the_variable_alone_and_the_spec_cannot_set_it(
        agents: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU node nothing is added, and a spec's CUDA_VISIBLE_DEVICES (an older control plane's) is dropped."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    a = agents(node=lambda: facts())
    monkeypatch.setenv("PYTHONSTARTUP", "/agents/own")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    a.run(a.sup.start(spec("a", env=(("CUDA_VISIBLE_DEVICES", "0"), ("LLMGW_SHARD_ID", "other"),
                                     ("LD_PRELOAD", "/tmp/evil.so"), ("PYTHONSTARTUP", "/tmp/evil.py")))))
    env = environ(a.wait_state("a", S.READY).pid)
    assert "CUDA_VISIBLE_DEVICES" not in env and env["LLMGW_SHARD_ID"] == "a"
    # A loader or interpreter variable from an older control plane (or a model stored before the
    # refusal) never reaches the engine: back to the agent's own, or unset.
    assert "LD_PRELOAD" not in env and env["PYTHONSTARTUP"] == "/agents/own"


def test_a_gpu_the_node_lacks_or_one_given_twice_fails_before_any_process(agents: Callable[..., Agent]) -> None:
    """The refusal names the GPU and what the node has; no engine is started."""
    before = supervised.children()
    a = agents(node=lambda: facts(0, 1))
    missing = a.run(a.sup.start(spec("a", gpus=(1, 5))))
    assert missing.state is S.FAILED and missing.pid == 0
    assert "asks for GPU 5, which this node does not have (its GPUs: 0, 1)" in missing.message
    twice = a.run(a.sup.start(spec("b", gpus=(1, 1))))
    assert twice.state is S.FAILED and "GPU 1 is listed twice" in twice.message
    none = agents(node=lambda: facts())
    assert "(its GPUs: none)" in none.run(none.sup.start(spec("c", gpus=(0,)))).message
    assert supervised.children() <= before  # nothing started


def test_a_restarted_agent_adopts_the_engine_with_its_gpus(agents: Callable[..., Agent], tmp_path: Path) -> None:
    """The state file keeps the gpus, so the adopted shard reports the GPUs its engine really holds."""
    a = agents(node=lambda: facts(*FOUR_GPUS))
    a.run(a.sup.start(spec("a", gpus=(3,))))
    ready = a.wait_state("a", S.READY)
    a.die()
    assert statefiles.read(tmp_path / "run" / "a.json").spec.gpus == (3,)
    b = agents(node=lambda: facts(*FOUR_GPUS))
    [adopted] = b.run(b.sup.recover())
    assert (adopted.pid, adopted.adopted, adopted.spec) == (ready.pid, True, spec("a", gpus=(3,)))
    assert b.wait_state("a", S.READY).spec.gpus == (3,)
    assert environ(ready.pid)["CUDA_VISIBLE_DEVICES"] == "3"
    # A retried start with the same spec is the adopted engine, not a second one on GPU 3.
    assert b.run(b.sup.start(spec("a", gpus=(3,)))).pid == ready.pid
