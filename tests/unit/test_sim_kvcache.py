"""The sim engine's simulated KV cache: what eviction leaves of a prompt is a prefix, as on vLLM."""

from __future__ import annotations

import asyncio

from llmgw.sim.engine.kvcache import SimKvCache


def test_eviction_takes_a_prompts_tail_first_so_its_prefix_stays_cached() -> None:
    async def run() -> tuple[int, int]:
        cache = SimKvCache(None, capacity_blocks=4, block_size=16)
        a, b = list(range(100, 148)), list(range(500, 532))  # 3 blocks, 2 blocks
        assert await cache.admit(a) == 0
        assert await cache.admit(b) == 0  # 5 blocks for 4: one of a's goes
        return await cache.admit(a), len(cache.held)

    hit, held = asyncio.run(run())
    # vLLM frees a request's blocks in reverse, so its tail block is evicted and its first two still hit
    # (plain LRU evicted a's first block and with it, the hashes being chained, every later one).
    assert hit == 32 and held == 4
