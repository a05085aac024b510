"""The supervisor's parts: readiness probing against a real sim, cancel-safety, refusals, bookkeeping."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import psutil
import pytest

from llmgw.agent.supervisor import Supervisor, ending, launching, probing
from llmgw.core.errors import EngineError
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing import procs
from llmgw.testing.supervised import run_supervised

S = ShardState


def spec(shard_id: str, **kw: object) -> ShardSpec:
    fields: dict[str, object] = dict(shard_id=shard_id, replica_id="r", model="m", engine="sim",
                                     served_name="m", api_key="k")
    return ShardSpec(**{**fields, **kw})  # type: ignore[arg-type]


def run_with(tmp_path: Path, body, **kw: object) -> list[ShardStatus]:
    """Run ``body(sup)`` on a fresh loop; always stop and close the supervisor afterwards."""
    return run_supervised(tmp_path, body, **kw)


@pytest.mark.slow
def test_probe_wants_the_served_model_listed_not_just_health(tmp_path: Path) -> None:
    """/health 200 is not ready while /v1/models lists another name; a wrong key is named too."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw.sim.engine", "--host", "127.0.0.1", "--port", str(port),
            "--model", "other", "--api-key", "k"]
    with procs.Proc.start(argv, log_path=tmp_path / "sim.log") as proc:
        proc.wait_http(f"http://127.0.0.1:{port}/health")

        async def ask(name: str, key: str) -> str | None:
            async with aiohttp.ClientSession() as session:
                return await probing.probe(session, f"http://127.0.0.1:{port}", health_path="/health",
                                           served_name=name, api_key=key)

        assert asyncio.run(ask("other", "k")) is None
        assert "does not list 'm'" in (asyncio.run(ask("m", "k")) or "")
        assert asyncio.run(ask("other", "bad")) == "/v1/models answered 401"
    assert "no answer" in (asyncio.run(ask("other", "k")) or "")


@pytest.mark.slow
def test_a_cancelled_start_still_finishes_the_launch(tmp_path: Path) -> None:
    """A caller cancelled mid-start (a dropped stream) leaves a shard that is watched and stoppable."""
    async def body(sup: Supervisor) -> None:
        caller = asyncio.create_task(sup.start(spec("a")))
        await asyncio.sleep(0)  # the launch is under way
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        st = await sup.start(spec("a"))
        assert st.pid > 0
        for _ in range(300):
            if (now := sup.status("a")) is not None and now.state is not S.STARTING:
                break
            await asyncio.sleep(0.05)
        assert now is not None and now.state is S.READY
        assert (await sup.stop("a")).state is S.STOPPED

    seen = run_with(tmp_path, body)
    assert [s.state for s in seen] == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]


@pytest.mark.slow
def test_close_leaves_engines_running(tmp_path: Path) -> None:
    """close() stops watching but not the processes (a restarted agent adopts them later)."""
    pids: list[int] = []

    async def body(sup: Supervisor) -> None:
        pids.append((await sup.start(spec("a"))).pid)
        await sup.close()
        assert psutil.pid_exists(pids[0])
        assert (await sup.stop("a", grace_s=2)).state is S.STOPPED

    run_with(tmp_path, body)
    assert not psutil.pid_exists(pids[0])


def test_refusals_are_failed_statuses_that_say_what_to_fix(tmp_path: Path) -> None:
    """A missing model file, a bad shard id and a reserved flag are FAILED before anything runs."""
    async def body(sup: Supervisor) -> None:
        missing = await sup.start(spec("a", source="file:///no/such/model.gguf"))
        assert missing.state is S.FAILED and "does not exist on this node" in missing.message
        bad_id = await sup.start(spec("../evil"))
        assert bad_id.state is S.FAILED and "shard id '../evil' is not valid" in bad_id.message
        reserved = await sup.start(spec("c", args=("--port", "1")))
        assert reserved.state is S.FAILED and "--port" in reserved.message
        assert psutil.Process().children() == []

    seen = run_with(tmp_path, body)
    assert [s.state for s in seen] == [S.FAILED] * 3
    assert not (tmp_path.parent / "evil.log").exists()


def test_an_adapter_bug_is_a_failed_status_not_an_exception(tmp_path: Path) -> None:
    """start() never raises: an adapter that blows up gives FAILED naming the error."""
    def broken(name: str, version: str = "") -> object:
        raise KeyError("boom")

    async def body(sup: Supervisor) -> None:
        st = await sup.start(spec("a"))
        assert st.state is S.FAILED and "internal error KeyError" in st.message

    run_with(tmp_path, body, adapters=SimpleNamespace(get=broken))


def test_terminal_shards_are_forgotten_beyond_the_bound(tmp_path: Path) -> None:
    """Only the latest max_terminal ended shards are remembered."""
    async def body(sup: Supervisor) -> None:
        for i in range(3):
            await sup.start(spec(f"s{i}", engine="nope"))
        assert [s.shard_id for s in sup.statuses()] == ["s1", "s2"]

    run_with(tmp_path, body, max_terminal=2)


@pytest.mark.slow
def test_a_forgotten_shard_takes_its_log_with_it(tmp_path: Path) -> None:
    """Beyond max_terminal, the oldest ended shard and its log file are both gone."""
    async def body(sup: Supervisor) -> None:
        for i in range(3):
            await sup.start(spec(f"s{i}", args=("--no-such-flag",)))
            for _ in range(300):
                if (st := sup.status(f"s{i}")) is None or st.state is S.FAILED:
                    break
                await asyncio.sleep(0.05)
        assert [s.shard_id for s in sup.statuses()] == ["s1", "s2"]

    run_with(tmp_path, body, max_terminal=2)
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["s1.log", "s2.log"]


def test_a_listener_that_raises_does_not_break_the_supervisor(tmp_path: Path) -> None:
    """on_status raising is logged; the transition still happens."""
    def angry(status: ShardStatus) -> None:
        raise RuntimeError("listener bug")

    async def main() -> None:
        sup = Supervisor(run_dir=tmp_path, host="127.0.0.1", on_status=angry)
        assert (await sup.start(spec("a", engine="nope"))).state is S.FAILED
        await sup.close()

    asyncio.run(main())


def test_exit_words_and_log_tail(tmp_path: Path) -> None:
    """Exit codes and signals in words; the tail quotes only this run's non-empty lines."""
    assert ending.describe_exit(1) == "exited with code 1"
    assert ending.describe_exit(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
    log = tmp_path / "x.log"
    log.write_text("old run\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("".join(f"line {i}\n\n" for i in range(30)))
    assert ending.tail(log, offset) == tuple(f"line {i}" for i in range(10, 30))
    assert ending.tail(tmp_path / "none.log", 0) == ()


def test_endpoints_and_ports() -> None:
    """IPv6 hosts are bracketed; a host that is not ours is an EngineError saying so."""
    assert launching.endpoint_of("::1", 8000) == "http://[::1]:8000"
    assert launching.endpoint_of("10.0.0.5", 8000) == "http://10.0.0.5:8000"
    assert launching.free_port("127.0.0.1") > 0
    with pytest.raises(EngineError, match="must be an address of this machine"):
        launching.free_port("192.0.2.1")
