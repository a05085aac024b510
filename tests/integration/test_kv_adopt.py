"""An engine adopted from a previous agent is followed again (issue 31): a restarted agent's ``KvLinks`` binds the
ports the engine's argv names (the state file's), the engine's PUB reconnects by itself, and the new follower
fills what it missed from the engine's replay buffer: it knows the blocks stored while no agent listened.

A real sim engine process publishing vLLM's events; the agent's own ``KvLinks`` twice (the old agent, the new).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import openai

from llmgw.agent import kvlink
from llmgw.agent.supervisor import launching
from llmgw.core import kvhash
from llmgw.core.shards import ShardSpec
from llmgw.testing import procs

SPEC = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", kv_events=True)


async def _until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what}")


def _prompt(seed: int, blocks: int = 3) -> list[int]:
    return [(seed * 7919 + i * 31) % 30000 + 1 for i in range(16 * blocks)]


def _ext(tokens: list[int]) -> set[int]:
    return {int(kvhash.external(h)) for h in kvhash.block_hashes(tokens, 16)}


async def _scenario(tmp: Path) -> None:
    port = procs.free_port()
    base = launching.Plan(argv=[sys.executable, "-m", "llmgw.sim.engine", "--model", "m", "--port", str(port),
                                "--prefill-tps", "100000", "--decode-tps", "10000"],
                          env={}, endpoint=f"http://127.0.0.1:{port}", health_path="/health", log_path=tmp / "sim.log")
    old = kvlink.KvLinks(lambda **_: None)
    plan = old.attach(SPEC, base)
    sim = procs.Proc.start(plan.argv, log_path=tmp / "sim.log")
    new: kvlink.KvLinks | None = None
    try:
        url = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(sim.wait_http, url + "/health", timeout=20)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        first = _prompt(1)
        await client.completions.create(model="m", prompt=first, max_tokens=1)
        await _until(lambda: _ext(first) <= old._links["s1"].follower.blocks.blocks, "the old agent saw the blocks")
        old.close()  # the agent goes; the engine runs on, and stores blocks nobody hears of
        missed = _prompt(2)
        await client.completions.create(model="m", prompt=missed, max_tokens=1)
        # The restarted agent adopts the engine: the plan rebuilt from its state file names the same ports.
        new = kvlink.KvLinks(lambda **_: None)
        assert new.attach(SPEC, plan) is plan  # followed where it publishes, not told anything new
        follower = new._links["s1"].follower
        assert follower.endpoint == old_endpoint(plan)
        later = _prompt(3)
        for _ in range(50):  # the PUB reconnects on its own schedule: a batch sent before that is lost, and replayed
            await client.completions.create(model="m", prompt=later, max_tokens=1)
            if _ext(later) <= follower.blocks.blocks:
                break
            await asyncio.sleep(0.1)
        await _until(lambda: _ext(later) <= follower.blocks.blocks, "the new agent hears the engine again")
        # What was stored while no agent listened came back from the replay buffer.
        assert _ext(first) | _ext(missed) <= follower.blocks.blocks
        assert follower.replays >= 1 and follower.resyncs == 0
    finally:
        if new is not None:
            new.close()
        sim.stop()


def old_endpoint(plan: launching.Plan) -> str:
    return json.loads(plan.argv[plan.argv.index("--kv-events-config") + 1])["endpoint"]


def test_an_adopted_engine_is_followed_on_its_ports_and_what_was_missed_is_replayed(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
