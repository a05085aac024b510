"""The KV event path on real processes: sim engines publish vLLM's events, the agent's follower keeps each
replica's block set (through eviction), and ``kv_aware`` picks the replica that holds the prompt's prefix.

Each sim is a process started with vLLM's ``--kv-events-config`` naming the loopback endpoints the
follower binds (``kvfollow.kv_events_config``); requests go through the real ``openai`` client as
completions given as token ids (the router has no tokenizer: ``kv_aware`` needs ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import openai

from llmgw.agent import kvfollow
from llmgw.core import kvhash
from llmgw.router import policies
from llmgw.router.kvview import KvView, ReplicaCache
from llmgw.router.pick import RequestKey
from llmgw.router.table import Endpoint
from llmgw.testing import procs

CAPACITY = 8  # blocks: a 5-block prompt after another evicts most of the first


async def _until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def _prompt(seed: int, blocks: int = 5) -> list[int]:
    return [(seed * 7919 + i * 31) % 30000 + 1 for i in range(16 * blocks)]


async def _scenario(tmp: Path) -> None:
    sims: list[procs.Proc] = []
    followers: list[kvfollow.KvFollower] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        urls = []
        for i in range(2):
            config = kvfollow.kv_events_config(procs.free_port(), procs.free_port())
            cfg = json.loads(config)
            follower = kvfollow.KvFollower(cfg["endpoint"], cfg["replay_endpoint"])
            followers.append(follower)
            tasks.append(asyncio.create_task(follower.run()))
            port = procs.free_port()
            sims.append(procs.Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--model", "m", "--port", str(port),
                                          "--kv-events-config", config, "--kv-cache-blocks", str(CAPACITY),
                                          "--prefill-tps", "100000", "--decode-tps", "10000"],
                                         log_path=tmp / f"sim{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for sim, url in zip(sims, urls, strict=True):
            await asyncio.to_thread(sim.wait_http, f"{url}/health", timeout=20)
        clients = [openai.AsyncOpenAI(base_url=u + "/v1", api_key="none", max_retries=0) for u in urls]
        a, b = _prompt(1), _prompt(2)
        # The PUB connects after the follower binds; still, a first batch can race the connection: retry a warm-up.
        warm = _prompt(99, 1)
        for client, follower in zip(clients, followers, strict=True):
            for _ in range(50):
                await client.completions.create(model="m", prompt=warm, max_tokens=1)
                if follower.blocks.blocks:
                    break
                await asyncio.sleep(0.05)
        done = await clients[0].completions.create(model="m", prompt=a, max_tokens=1)
        assert done.usage is not None and done.usage.prompt_tokens == 80
        ext_a = {int(kvhash.external(h)) for h in kvhash.block_hashes(a, 16)}
        await _until(lambda: ext_a <= followers[0].blocks.blocks, "replica 0 holds prompt a's blocks")
        again = await clients[0].completions.create(model="m", prompt=a, max_tokens=1)
        assert again.usage.prompt_tokens_details.cached_tokens == 80  # type: ignore[union-attr]
        await clients[1].completions.create(model="m", prompt=b, max_tokens=1)
        ext_b = {int(kvhash.external(h)) for h in kvhash.block_hashes(b, 16)}
        await _until(lambda: ext_b <= followers[1].blocks.blocks, "replica 1 holds prompt b's blocks")

        view = KvView()
        for i, f in enumerate(followers):
            view.update(f"r{i}", ReplicaCache(frozenset(f.blocks.blocks), f.blocks.block_size or 16))
        policy = policies.create(policies.Options(kv_view=view))["kv_aware"]
        eps = (Endpoint("r0", urls[0]), Endpoint("r1", urls[1]))
        for prompt, holder in ((a, "r0"), (b, "r1")):
            chosen, lacking = policy.pick("m", eps, key=RequestKey(tokens=tuple(prompt)))
            assert chosen is not None and chosen.replica_id == holder and lacking == 0

        # Eviction: a second 5-block prompt on replica 0 pushes most of a's blocks out of its 8.
        await clients[0].completions.create(model="m", prompt=b, max_tokens=1)
        await _until(lambda: ext_b <= followers[0].blocks.blocks and len(followers[0].blocks.blocks) <= CAPACITY,
                     "replica 0 evicted down to its capacity")
        assert not ext_a <= followers[0].blocks.blocks
        assert followers[0].resyncs == 0
        for c in clients:
            await c.close()
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for f in followers:
            f.close()
        for s in sims:
            s.stop()


def test_sim_events_reach_the_follower_and_kv_aware_picks_the_holder(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
