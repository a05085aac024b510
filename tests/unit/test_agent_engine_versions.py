"""The installed engines' versions, probed off the event loop (a vLLM probe takes seconds), and the node facts the
checks before a launch are given: the registration's, with GPUs as last sampled and engines as last probed."""

from __future__ import annotations

import asyncio
import threading

from llmgw.agent import main
from llmgw.core import enginecheck, inventory


async def probed(versions: main.EngineVersions) -> None:
    """Return once a probe has answered (bounded: a probe that never does fails the test)."""
    for _ in range(3000):
        if versions.latest() is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no probe answered within 30 s")


def test_probing_runs_in_a_thread_while_the_loop_goes_on() -> None:
    """A probe that blocks until the loop itself releases it finishes: it never held the loop."""
    released = threading.Event()
    where: list[bool] = []

    def probe() -> list[tuple[str, str]]:
        where.append(threading.current_thread() is threading.main_thread())
        # Released by a coroutine on the loop: a probe run on the loop would wait here in vain.
        return [("vllm", "0.32.0")] if released.wait(timeout=30) else []

    versions = main.EngineVersions(probe)

    async def scenario() -> main.Versions | None:
        task = asyncio.create_task(versions.run(interval_s=3600))
        await asyncio.sleep(0)
        assert versions.latest() is None  # under way; asking the latest never probes
        released.set()
        await probed(versions)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return versions.latest()

    assert asyncio.run(scenario()) == (("vllm", "0.32.0"),)
    assert where == [False]


def test_the_registration_waits_for_a_probe_under_way_instead_of_probing_twice() -> None:
    """``first`` answers the first probe's result, once there is one; later asks do not probe again."""
    calls: list[int] = []
    started, release = threading.Event(), threading.Event()

    def probe() -> list[tuple[str, str]]:
        calls.append(1)
        started.set()
        release.wait(timeout=30)
        return [("sglang", "0.5.23")]

    versions = main.EngineVersions(probe)
    background = threading.Thread(target=versions.probe)
    background.start()
    assert started.wait(timeout=30)
    got: list[main.Versions] = []
    registering = threading.Thread(target=lambda: got.append(versions.first()))
    registering.start()
    release.set()
    background.join(timeout=30)
    registering.join(timeout=30)
    assert got == [(("sglang", "0.5.23"),)] and len(calls) == 1
    assert versions.first() == (("sglang", "0.5.23"),) and len(calls) == 1


def test_a_probe_that_raises_does_not_end_the_probing() -> None:
    """The next probe still runs: the engine may be installed by then."""
    answers: list[object] = [RuntimeError("broken adapter"), [("vllm", "0.32.0")]]

    def probe() -> list[tuple[str, str]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    versions = main.EngineVersions(probe)

    async def scenario() -> main.Versions | None:
        task = asyncio.create_task(versions.run(interval_s=0.01))
        await probed(versions)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return versions.latest()

    assert asyncio.run(scenario()) == (("vllm", "0.32.0"),)


def _gpu(index: int, used: int) -> inventory.Gpu:
    return inventory.Gpu(index, f"GPU-{index}", "H200", 141 << 30, used, compute_capability="9.0")


def test_node_facts_take_the_sampled_gpus_and_the_probed_engines() -> None:
    """Memory in use as last sampled, engines as last probed; a GPU missing from the sample keeps the registered."""
    hca = inventory.Hca("mlx5_0")
    inv = inventory.Inventory(cpu_count=16, memory_total_bytes=1 << 37, memory_available_bytes=1 << 36,
                              gpus=(_gpu(0, 0), _gpu(1, 0)), engines=(("llamacpp", "b1"),), hcas=(hca,),
                              mgmt_interface="ens7", host=inventory.HostFacts(cpu_flags=("avx2",)))
    assert main.facts_of(None, sampled_gpus=None, versions=None) is None
    plain = main.facts_of(inv, sampled_gpus=None, versions=None)
    assert plain == enginecheck.NodeFacts(gpus=inv.gpus, engines=(("llamacpp", "b1"),), mgmt_interface="ens7",
                                          hcas=(hca,), cpu_flags=("avx2",))
    busy = (_gpu(1, 40 << 30), _gpu(0, 8 << 30))
    now = main.facts_of(inv, sampled_gpus=busy, versions=(("vllm", "0.32.0"),))
    assert now is not None and now.gpus == busy and now.engines == (("vllm", "0.32.0"),)
    lost = main.facts_of(inv, sampled_gpus=(_gpu(0, 8 << 30),), versions=None)
    assert lost is not None and lost.gpus == inv.gpus
