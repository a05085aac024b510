"""The supervisor against real sim engines: start, readiness, idempotency, stops, failures.

Each test gets its own event loop and supervisor; the fixture stops every
shard and then kills anything still left among this process's children, so a
failing test never leaves an engine running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import psutil
import pytest

from llmgw.agent import engines
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing import supervised
from llmgw.testing.supervised import SupervisorHarness

S = ShardState
pytestmark = pytest.mark.slow


class Harness(SupervisorHarness):
    def __init__(self, tmp_path: Path, **kw: Any) -> None:
        super().__init__(tmp_path / "run", **{"grace_s": 5.0, **kw})


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []
    before = supervised.children()

    def make(**kw: Any) -> Harness:
        made.append(Harness(tmp_path, **kw))
        return made[-1]

    yield make
    for h in made:
        try:
            h.run(h.sup.stop_all(reason="test over"))
            h.run(h.sup.close())
        finally:
            h.loop.close()
    supervised.kill_started_since(before)


def spec(shard_id: str, *args: str, engine: str = "sim") -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine=engine,
                     served_name="m", api_key="k", args=args)


def children() -> list[int]:
    return sorted(p.pid for p in psutil.Process().children(recursive=True))


async def models(endpoint: str, key: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(endpoint + "/v1/models",
                                                   headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json(content_type=None)


def test_sim_shard_starts_becomes_ready_and_serves(harness: Callable[..., Harness]) -> None:
    """STARTING is reported at once with endpoint and pid; READY follows once the model is listed."""
    h = harness()
    st = h.run(h.sup.start(spec("a", "--startup-delay", "0.5")))
    assert st.state is S.STARTING and st.pid > 0 and st.endpoint.startswith("http://127.0.0.1:")
    assert h.states("a") == [S.STARTING]
    ready = h.wait_state("a", S.READY)
    assert (ready.pid, ready.endpoint, ready.replica_id) == (st.pid, st.endpoint, "r-a")
    status, body = h.run(models(ready.endpoint, "k"))
    assert status == 200 and [m["id"] for m in body["data"]] == ["m"]
    assert h.run(models(ready.endpoint, "wrong"))[0] == 401
    assert h.states("a") == [S.STARTING, S.READY]


def test_repeated_start_launches_nothing(harness: Callable[..., Harness]) -> None:
    """A second start with the same shard id, even concurrent with the first, is the same process."""
    h = harness()

    async def twice() -> tuple[ShardStatus, ShardStatus]:
        return await asyncio.gather(h.sup.start(spec("a")), h.sup.start(spec("a")))

    first, second = h.run(twice())
    assert first.pid == second.pid and children() == [first.pid]
    h.wait_state("a", S.READY)
    again = h.run(h.sup.start(spec("a")))
    assert (again.state, again.pid) == (S.READY, first.pid)
    assert children() == [first.pid]
    assert h.states("a") == [S.STARTING, S.READY]


def test_stop_reports_stopping_then_stopped_and_the_process_is_gone(
        harness: Callable[..., Harness]) -> None:
    """SIGTERM ends the sim at once; stopping again, or an unknown shard, is a quiet STOPPED."""
    h = harness()
    pid = h.run(h.sup.start(spec("a"))).pid
    h.wait_state("a", S.READY)
    st = h.run(h.sup.stop("a", reason="scaled down"))
    assert (st.state, st.exit_code, st.message) == (S.STOPPED, 0, "scaled down")
    assert h.states("a") == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    assert not psutil.pid_exists(pid) and children() == []
    assert h.run(h.sup.stop("a")) == st
    assert h.run(h.sup.stop("never-started")).state is S.STOPPED
    assert h.states("a") == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]


def test_stop_while_starting_never_reports_ready(harness: Callable[..., Harness]) -> None:
    """A shard stopped while it still loads goes STARTING, STOPPING, STOPPED."""
    h = harness()
    started = h.run(h.sup.start(spec("a", "--startup-delay", "30")))

    async def loading() -> None:
        """Until the engine is up and loading (its model list answers 503), not still being imported."""
        deadline = time.monotonic() + 15
        while True:
            try:
                status, body = await models(started.endpoint, "k")
                if status == 503 and body["error"]["code"] == "model_loading":
                    return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "the engine never came up"
            await asyncio.sleep(0.05)

    h.run(loading())
    stopped = h.run(h.sup.stop("a"))
    assert (stopped.state, stopped.exit_code) == (S.STOPPED, 0)  # it was up: it handled SIGTERM itself
    assert h.states("a") == [S.STARTING, S.STOPPING, S.STOPPED]


def test_engine_that_exits_early_fails_with_its_output(harness: Callable[..., Harness]) -> None:
    """A bad flag: FAILED with exit code 2, argparse's complaint in last_output and in the message."""
    h = harness()
    h.run(h.sup.start(spec("a", "--no-such-flag")))
    st = h.wait_state("a", S.FAILED)
    assert st.exit_code == 2
    assert any("unrecognized arguments: --no-such-flag" in line for line in st.last_output)
    assert st.message.startswith("engine exited with code 2 before it was ready: ")
    assert "--no-such-flag" in st.message
    assert h.states("a") == [S.STARTING, S.FAILED]
    again = h.run(h.sup.start(spec("a", "--no-such-flag")))
    assert again == st and h.states("a") == [S.STARTING, S.FAILED]


def test_unknown_engine_fails_without_a_process(harness: Callable[..., Harness]) -> None:
    """An engine nobody knows is FAILED with the known engines named; nothing is launched."""
    h = harness()
    st = h.run(h.sup.start(spec("a", engine="nope")))
    assert st.state is S.FAILED and st.pid == 0
    assert "unknown engine 'nope'" in st.message and "sim" in st.message
    assert children() == [] and h.states("a") == [S.FAILED]


def test_engine_killed_after_ready_is_reported_failed(harness: Callable[..., Harness]) -> None:
    """Nobody asked for the stop: FAILED with the signal as the exit code."""
    h = harness()
    pid = h.run(h.sup.start(spec("a"))).pid
    h.wait_state("a", S.READY)
    os.kill(pid, signal.SIGKILL)
    st = h.wait_state("a", S.FAILED)
    assert st.exit_code == -signal.SIGKILL
    assert st.message.startswith("engine was killed by signal 9 (SIGKILL) after it was ready")
    assert h.states("a") == [S.STARTING, S.READY, S.FAILED]


# A launcher in front of the sim that ignores SIGTERM, the way a wrapper script
# that traps it would: the sim itself exits on SIGTERM, the leader does not.
_DEAF_LAUNCHER = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "subprocess.run(sys.argv[1:]); time.sleep(120)")


class DeafSim:
    """The sim adapter, launched under a leader that ignores SIGTERM."""

    name, health_path = "sim", "/health"

    def validate(self, spec: ShardSpec, **kw: Any) -> None:
        engines.get("sim").validate(spec, **kw)

    def launch(self, spec: ShardSpec, **kw: Any) -> engines.Launch:
        inner = engines.get("sim").launch(spec, **kw)
        return engines.Launch(argv=[sys.executable, "-c", _DEAF_LAUNCHER, *inner.argv], env=inner.env)

    def probe(self) -> str | None:
        return "test"


def test_leader_that_ignores_sigterm_is_killed_after_the_grace(harness: Callable[..., Harness]) -> None:
    """SIGTERM reaches the whole group (the sim exits), the deaf leader gets SIGKILL after the grace."""
    h = harness(adapters=SimpleNamespace(get=lambda name, version="": DeafSim()))
    h.run(h.sup.start(spec("a")))
    h.wait_state("a", S.READY)
    assert len(children()) == 2
    began = time.monotonic()
    st = h.run(h.sup.stop("a", grace_s=0.5))
    assert time.monotonic() - began >= 0.5
    assert (st.state, st.exit_code) == (S.STOPPED, -signal.SIGKILL)
    assert "did not exit within 0.5 s of SIGTERM and was killed" in st.message
    assert children() == []
