"""Engines that outlive their agent: a second supervisor on the same run dir adopts, forgets or kills.

Agent A is a supervisor on its own event loop that starts a sim engine and is
then closed with the engine left running, as a crashed or restarted agent
leaves it; agent B is a new supervisor on the same run dir, on a new loop.
Every process is a child of this test process; the fixture ends them all,
whatever the test did, and resumes any it froze first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from llmgw.agent.supervisor import launching, statefiles, watching
from llmgw.core import adapters
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing import procs
from llmgw.testing.supervised import LeavingHarness, harnesses

S = ShardState
pytestmark = pytest.mark.slow


Agent = LeavingHarness


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    with harnesses(tmp_path / "run") as make:
        yield make


def spec(shard_id: str, *args: str) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine="sim", served_name="m",
                     api_key="k", args=args)


async def serves(endpoint: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(endpoint + "/v1/models",
                                                       headers={"Authorization": "Bearer k"}) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def gone(pid: int, *, timeout: float = 5.0) -> bool:
    """True once ``pid`` (a child of this process, maybe already reaped by asyncio) has exited."""
    def dead() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    return bool(procs.wait_for(dead, timeout=timeout, what=f"pid {pid} gone"))


def left_running(agents: Callable[..., Agent], shard_id: str = "a") -> ShardStatus:
    """Agent A starts a sim shard, sees it READY and goes away; the engine keeps serving."""
    a = agents()
    a.run(a.sup.start(spec(shard_id)))
    ready = a.wait_state(shard_id, S.READY)
    a.die()
    assert psutil.pid_exists(ready.pid)
    return ready


def test_a_restarted_agent_adopts_the_running_engine(agents: Callable[..., Agent], tmp_path: Path) -> None:
    """recover() reports it STARTING adopted at once, then READY with the same pid; stop() ends it for good."""
    ready = left_running(agents)
    state = tmp_path / "run" / "a.json"
    assert state.stat().st_mode & 0o777 == 0o600
    saved = statefiles.read(state)
    assert (saved.pid, saved.endpoint, saved.spec) == (ready.pid, ready.endpoint, spec("a"))
    assert psutil.Process(ready.pid).environ()[launching.SHARD_ENV] == "a"

    planned: list[tuple[ShardSpec, launching.Plan]] = []
    b = agents(on_plan=lambda s, p: planned.append((s, p)) or p)
    began = time.monotonic()
    [adopted] = b.run(b.sup.recover())
    # The adopted engine's plan (its saved argv) goes to on_plan as a launch's does: the KV link follows it.
    assert [(s.shard_id, p.argv) for s, p in planned] == [("a", list(saved.argv))]
    assert time.monotonic() - began < 1.0
    assert (adopted.state, adopted.adopted, adopted.pid) == (S.STARTING, True, ready.pid)
    assert adopted.message == f"adopted from a previous agent (pid {ready.pid})"
    assert (adopted.endpoint, adopted.spec, adopted.replica_id) == (ready.endpoint, spec("a"), "r-a")
    now = b.wait_state("a", S.READY)
    assert (now.pid, now.adopted) == (ready.pid, False) and now.message.startswith("adopted engine answers")
    assert b.run(serves(ready.endpoint)) and b.sup.pids() == {"a": ready.pid}
    assert b.run(b.sup.start(spec("a"))).pid == ready.pid  # a retried start is the adopted engine

    st = b.run(b.sup.stop("a", reason="scaled down"))
    assert (st.state, st.message, st.exit_code) == (S.STOPPED, "scaled down", None)
    assert gone(ready.pid) and not state.exists() and (tmp_path / "run" / "a.log").exists()
    assert b.states("a") == [S.STARTING, S.READY, S.STOPPING, S.STOPPED] and b.sup.pids() == {}
    assert agents().run(agents().sup.recover()) == []


def test_a_dead_or_reused_pid_only_loses_its_state_file(agents: Callable[..., Agent], tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A state file naming a pid that has exited, or one now held by another process, is removed; nothing is killed."""
    caplog.set_level(logging.INFO, logger="llmgw.agent.supervisor")
    run = tmp_path / "run"
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    # The process that now holds a pid is a plain HTTP server with default signal handling: any
    # SIGTERM or SIGKILL sent during recover() ends it before it can answer again.
    port = procs.free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with procs.Proc.start(argv, log_path=tmp_path / "x.log") as other:
        url = f"http://127.0.0.1:{port}/"
        other.wait_http(url, timeout=10)
        for shard_id, pid in (("dead", dead_pid), ("reused", other.pid)):
            statefiles.write(run, statefiles.Saved(spec=spec(shard_id), pid=pid, create_time=time.time() - 3600,
                                                   port=1, endpoint="http://127.0.0.1:1", host="127.0.0.1",
                                                   log_path=run / f"{shard_id}.log"))
        b = agents()
        assert b.run(b.sup.recover()) == []
        assert statefiles.listing(run) == [] and b.seen == []
        # The pass looked at each pid and told them apart, rather than dropping the files unread.
        removed = {r.args[0].name: r.args[1] for r in caplog.records if r.msg.startswith("removing state file")}
        assert removed == {"dead.json": f"its engine (pid {dead_pid}) is no longer running",
                           "reused.json": f"pid {other.pid} now belongs to another process (its environment does "
                                          "not name shard reused): the engine exited and the pid was reused"}
        # recover() has returned, so any signal it sent has been sent: an answer now means none was.
        other.wait_http(url, timeout=10)
        assert other.poll() is None


def test_engines_nothing_describes_are_killed(agents: Callable[..., Agent], tmp_path: Path) -> None:
    """Marked with this run dir but no state file, or an unreadable one: killed. Another run dir's: left alone."""
    run = (tmp_path / "run").resolve()
    run.mkdir()
    (run / "garbled.json").write_text("{half a file")

    def sim(shard_id: str, run_dir: Path) -> procs.Proc:
        env = {**os.environ, launching.SHARD_ENV: shard_id, launching.RUN_DIR_ENV: str(run_dir)}
        argv = [sys.executable, "-m", "llmgw.sim.engine", "--port", "0", "--model", "m"]
        return procs.Proc.start(argv, env=env, log_path=tmp_path / f"{shard_id}.out")

    with sim("nofile", run) as nofile, sim("garbled", run) as garbled, sim("other", tmp_path / "b") as other:
        for p in (nofile, garbled, other):
            procs.wait_for(lambda p=p: "listening on" in p.log_tail(), timeout=10, what="sim listening")
        b = agents()
        assert b.run(b.sup.recover()) == []
        assert nofile.popen.wait(timeout=5) == -signal.SIGKILL
        assert garbled.popen.wait(timeout=5) == -signal.SIGKILL
        assert other.poll() is None and statefiles.listing(run) == []


def test_an_adopted_engine_that_dies_is_failed(agents: Callable[..., Agent], tmp_path: Path) -> None:
    """Killed from outside after adoption: FAILED, no exit code, the end of its log quoted."""
    ready = left_running(agents)
    b = agents()
    b.run(b.sup.recover())
    b.wait_state("a", S.READY)
    os.kill(ready.pid, signal.SIGKILL)
    st = b.wait_state("a", S.FAILED)
    assert st.message.startswith(watching.ADOPTED_EXIT + " after it was ready")
    assert st.exit_code is None and any("listening on" in line for line in st.last_output)
    assert b.states("a") == [S.STARTING, S.READY, S.FAILED] and b.sup.pids() == {}
    assert statefiles.listing(tmp_path / "run") == []


def test_an_adopted_engine_that_does_not_answer_is_stopped_and_failed(agents: Callable[..., Agent],
                                                                     tmp_path: Path) -> None:
    """A frozen engine (SIGSTOP) is given adopt_timeout_s, then killed: FAILED means it is gone."""
    ready = left_running(agents)
    os.kill(ready.pid, signal.SIGSTOP)
    try:
        b = agents(adopt_timeout_s=1.0, grace_s=0.3)
        began = time.monotonic()
        [adopted] = b.run(b.sup.recover())
        assert adopted.state is S.STARTING
        st = b.wait_state("a", S.FAILED, timeout=8)
        assert 1.0 <= time.monotonic() - began < 5.0
        assert st.message.startswith("adopted engine did not answer within 1 s")
        assert gone(ready.pid)
        assert b.states("a") == [S.STARTING, S.FAILED] and statefiles.listing(tmp_path / "run") == []
    finally:
        try:
            os.kill(ready.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


async def holding(sup: object, shard_id: str, want: tuple[str, ...], *, timeout: float = 15) -> ShardStatus:
    """The shard's status once its engine reports holding ``want``, on the supervisor's own loop."""
    deadline = time.monotonic() + timeout
    while (st := sup.status(shard_id)) is None or st.adapters != want:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise AssertionError(f"{shard_id} holds {st and st.adapters}, not {want}: {st}")
        await asyncio.sleep(0.05)
    return st


def test_an_adopted_engine_reports_the_adapters_it_holds_without_loading_them_again(
        agents: Callable[..., Agent], tmp_path: Path) -> None:
    """The state file keeps the adapter list; the new agent reads what the engine holds from the engine itself."""
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "adapter_config.json").write_text("{}")
    listed = (adapters.Adapter("sql", f"file://{tmp_path / 'sql'}"),)
    args, env = adapters.launch_args("sim", listed)
    with_lora = dataclasses.replace(spec("l", *args), env=env, adapters=listed)
    a = agents()
    a.run(a.sup.start(with_lora))
    a.run(holding(a.sup, "l", ("sql",)))
    a.die()
    b = agents()
    [adopted] = b.run(b.sup.recover())
    assert adopted.spec is not None and adopted.spec.adapters == listed
    st = b.run(holding(b.sup, "l", ("sql",)))
    assert st.adapters_message == ""  # read from the engine, not loaded again ("already been loaded")
