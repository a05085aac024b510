"""Drain against real engines: DRAINED only once what was in flight has finished, or at the timeout.

The property that matters is the one the control plane relies on: a stop sent
the moment DRAINED is reported cuts no request. So each test stops the shard
right after DRAINED and then checks that every client got its whole stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.agent import engines
from llmgw.agent.supervisor import Supervisor, probing
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing import tiny_gguf
from llmgw.testing.supervised import run_supervised

S = ShardState
pytestmark = pytest.mark.slow
AUTH = {"Authorization": "Bearer k"}


def spec(shard_id: str, *args: str, **kw: Any) -> ShardSpec:
    fields: dict[str, Any] = dict(shard_id=shard_id, replica_id="r", model="m", engine="sim", served_name="m",
                                  api_key="k", args=args)
    return ShardSpec(**{**fields, **kw})


def run_with(tmp_path: Path, body: Callable[[Supervisor], Awaitable[None]]) -> list[ShardStatus]:
    """Run ``body(sup)`` on a fresh loop; stop and close the supervisor and kill children whatever happens."""
    return run_supervised(tmp_path / "run", body, grace_s=2.0)


async def until(sup: Supervisor, shard_id: str, state: ShardState, *, timeout: float = 15.0) -> ShardStatus:
    deadline = time.monotonic() + timeout
    while (st := sup.status(shard_id)) is None or st.state is not state:
        assert time.monotonic() < deadline, f"{shard_id} is {st and st.state}, not {state}: {st}"
        await asyncio.sleep(0.05)
    return st


async def stream(endpoint: str, *, max_tokens: int, started: asyncio.Event | None = None,
                 **extra: Any) -> tuple[int, bool]:
    """(text chunks received, whether the stream ended with [DONE]) of one streamed completion."""
    body = {"model": "m", "prompt": "hello", "max_tokens": max_tokens, "stream": True, **extra}
    chunks, done = 0, False
    async with aiohttp.ClientSession() as s, s.post(endpoint + "/v1/completions", json=body, headers=AUTH) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            if json.loads(data)["choices"]:
                chunks += 1
                if started is not None:
                    started.set()
    return chunks, done


def test_drain_waits_for_the_stream_in_flight(tmp_path: Path) -> None:
    """A 1 s stream under way: DRAINING, then DRAINED once it ended; a stop right then cuts nothing."""
    got: list[tuple[int, bool]] = []
    took: list[float] = []

    async def body(sup: Supervisor) -> None:
        await sup.start(spec("a", "--decode-tps", "20"))
        ready = await until(sup, "a", S.READY)
        started = asyncio.Event()
        client = asyncio.create_task(stream(ready.endpoint, max_tokens=20, started=started))
        await started.wait()
        began = time.monotonic()
        drained = await sup.drain("a", timeout_s=10)
        took.append(time.monotonic() - began)
        assert drained.state is S.DRAINED and drained.message.startswith("drained: nothing in flight after")
        assert (await sup.stop("a")).state is S.STOPPED
        got.append(await client)

    seen = run_with(tmp_path, body)
    assert got == [(20, True)]
    assert 0.5 < took[0] < 3.0
    assert [s.state for s in seen] == [S.STARTING, S.READY, S.DRAINING, S.DRAINED, S.STOPPING, S.STOPPED]


def test_an_idle_drain_is_quick_and_repeats_are_answered_as_they_are(tmp_path: Path) -> None:
    """Nothing in flight: DRAINED at the first poll; again, or unknown, changes nothing; it keeps serving."""
    async def body(sup: Supervisor) -> None:
        await sup.start(spec("a"))
        ready = await until(sup, "a", S.READY)
        began = time.monotonic()
        drained = await sup.drain("a", timeout_s=10)
        assert drained.state is S.DRAINED and time.monotonic() - began < 1.0
        assert await sup.drain("a", timeout_s=10) == drained
        assert (await sup.drain("nope", timeout_s=10)).state is S.STOPPED
        assert await stream(ready.endpoint, max_tokens=3) == (3, True)  # still running, and serving
        assert sup.pids() == {"a": ready.pid}
        os.kill(ready.pid, signal.SIGKILL)
        failed = await until(sup, "a", S.FAILED)
        assert "after it was ready" in failed.message

    seen = run_with(tmp_path, body)
    assert [s.state for s in seen] == [S.STARTING, S.READY, S.DRAINING, S.DRAINED, S.FAILED]


def test_drain_gives_up_at_its_timeout_and_says_so(tmp_path: Path) -> None:
    """A 10 s stream and a 0.6 s drain: DRAINED at ~0.6 s naming the request left; a repeat sees DRAINING."""
    async def body(sup: Supervisor) -> None:
        await sup.start(spec("a", "--decode-tps", "5"))
        ready = await until(sup, "a", S.READY)
        started = asyncio.Event()
        client = asyncio.create_task(stream(ready.endpoint, max_tokens=50, started=started))
        await started.wait()
        began = time.monotonic()
        first = asyncio.create_task(sup.drain("a", timeout_s=0.6))
        await until(sup, "a", S.DRAINING)  # the first drain has begun
        assert (await sup.drain("a", timeout_s=0.6)).state is S.DRAINING
        drained = await first
        assert 0.6 <= time.monotonic() - began < 1.5
        assert drained.state is S.DRAINED
        assert drained.message == ("drain timed out after 0.6 s; 1 request still in flight; "
                                   "stopping it now fails them")
        await sup.stop("a")
        client.cancel()
        await asyncio.gather(client, return_exceptions=True)

    run_with(tmp_path, body)


async def serves(endpoint: str) -> bool:
    """Whether the engine at ``endpoint`` lists its model now (it has loaded)."""
    try:
        async with aiohttp.ClientSession() as s, s.get(endpoint + "/v1/models", headers=AUTH) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def test_a_shard_still_loading_is_drained_at_once(tmp_path: Path) -> None:
    """Never ready, so never routed to: DRAINED without waiting; its engine loads, yet it never turns READY."""
    async def body(sup: Supervisor) -> None:
        await sup.start(spec("a", "--startup-delay", "0.3"))
        drained = await sup.drain("a", timeout_s=10)
        assert drained.state is S.DRAINED and "before it was ready" in drained.message
        deadline = time.monotonic() + 15
        while not await serves(drained.endpoint):  # its engine has loaded: a READY there was to be seen
            assert time.monotonic() < deadline, "the drained engine never loaded"
            await asyncio.sleep(0.05)
        # A witness on the same supervisor, launched only now: by the time its watcher has seen it
        # READY (a launch and 0.3 s of loading later), a's watcher, on the same loop and interval,
        # has had several probes of a loaded engine in which to turn it READY.
        await sup.start(spec("w", "--startup-delay", "0.3"))
        await until(sup, "w", S.READY)
        assert sup.status("a") == drained
        # And a's watcher was alive all along, not stalled: it still sees the process end.
        os.kill(drained.pid, signal.SIGKILL)
        failed = await until(sup, "a", S.FAILED)
        assert failed.message.startswith("engine was killed by signal 9 (SIGKILL) before it was ready")

    seen = run_with(tmp_path, body)
    assert [s.state for s in seen if s.shard_id == "a"] == [S.STARTING, S.DRAINED, S.FAILED]


@pytest.mark.skipif(engines.get("llamacpp").probe() is None, reason="neither llama-server nor xllamacpp installed")
def test_llamacpp_drain_counts_queued_requests_too(tmp_path: Path) -> None:
    """Real llama.cpp, one slot, twelve streams: DRAINED only after all of them, queued ones included."""
    model = tmp_path / "tiny.gguf"
    tiny_gguf.write_tiny_llama_gguf(model)
    got: list[tuple[int, bool]] = []

    async def body(sup: Supervisor) -> None:
        await sup.start(spec("l", "--parallel", "1", engine="llamacpp", source=f"file://{model}", threads=1))
        ready = await until(sup, "l", S.READY, timeout=30)
        clients = [asyncio.create_task(stream(ready.endpoint, max_tokens=400, ignore_eos=True)) for _ in range(12)]
        path, parse = engines.get("llamacpp").in_flight_probe()
        async with aiohttp.ClientSession() as session:
            for _ in range(200):  # until the server has them: running and queued
                count, said = await probing.in_flight(session, ready.endpoint, path, parse, api_key="k")
                if count:
                    break
                await asyncio.sleep(0.01)
            assert count and count > 1, said  # one slot, so the rest were counted as deferred
        drained = await sup.drain("l", timeout_s=30)
        assert drained.message.startswith("drained: nothing in flight"), drained.message
        await sup.stop("l")
        got.extend(await asyncio.gather(*clients))

    run_with(tmp_path, body)
    assert len(got) == 12 and all(done and chunks > 0 for chunks, done in got), got
