"""Later-turn TTFT with a KV cache that evicts: round robin vs ``prefix_cache`` vs ``kv_aware``, on two sim engines.

    .venv/bin/python bench/kv_aware_bench.py

Two sim engine processes publish vLLM's KV events from a simulated cache of ``--capacity`` blocks
of 16 tokens (so blocks are evicted), prefilling ``--prefill-tps`` uncached tokens a second. Two of
the agent's followers (``agent.kvfollow``) keep each replica's block set; the policies are the
router's own classes, called in-process (the router's transport of the block sets is not built
yet), with the load they would see (requests in flight per replica). ``--conversations`` chats of
``--turns`` turns run ``--concurrency`` at a time; each turn sends the whole conversation so far
(token ids, streamed) plus ``--grow`` new blocks. ``prefix_cache`` gets its key from the same token
ids (16-token chunks standing in for its text blocks), so it is not handicapped by token-id prompts.
Reported: TTFT p50/p90 of turns 2+, and the engines' hit rate (blocks found cached / blocks asked).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmgw.agent import kvfollow
from llmgw.router import policies
from llmgw.router.kvview import KvView, ReplicaCache
from llmgw.router.pick import RequestKey
from llmgw.router.table import Endpoint
from llmgw.testing import procs


def text_blocks(tokens: list[int]) -> tuple[int, ...]:
    out, h = [], 0
    for i in range(0, len(tokens) - 15, 16):
        h = hash((h, tuple(tokens[i:i + 16])))
        out.append(h)
    return tuple(out)


async def run_policy(name: str, a: argparse.Namespace, tmp: Path) -> dict[str, float]:
    sims, followers, tasks, urls = [], [], [], []
    try:
        for i in range(2):
            config = kvfollow.kv_events_config(procs.free_port(), procs.free_port())
            cfg = json.loads(config)
            f = kvfollow.KvFollower(cfg["endpoint"], cfg["replay_endpoint"])
            followers.append(f)
            tasks.append(asyncio.create_task(f.run()))
            port = procs.free_port()
            sims.append(procs.Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--model", "m", "--port", str(port),
                                          "--kv-events-config", config, "--kv-cache-blocks", str(a.capacity),
                                          "--prefill-tps", str(a.prefill_tps), "--decode-tps", "2000",
                                          "--parallel", str(a.parallel)], log_path=tmp / f"{name}-sim{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for s, u in zip(sims, urls, strict=True):
            await asyncio.to_thread(s.wait_http, f"{u}/health", timeout=30)
        eps = tuple(Endpoint(f"r{i}", u) for i, u in enumerate(urls))
        view = KvView()
        policy = policies.create(policies.Options(kv_view=view, prefill_wait_s=0))[name]
        load = {"r0": 0.0, "r1": 0.0}
        rng = random.Random(7)
        ttfts: list[float] = []
        async with httpx.AsyncClient(timeout=120) as client:
            for u in urls:  # warm the PUB->SUB connection
                for _ in range(20):
                    await client.post(u + "/v1/completions", json={"model": "m", "prompt": [1] * 16, "max_tokens": 1})
            sem = asyncio.Semaphore(a.concurrency)

            shared = [[rng.randrange(1, 30000) for _ in range(16 * a.system_blocks)] for _ in range(a.groups)]

            async def chat(c: int) -> None:
                # --groups: conversations share their group's system prompt (as kv_vllm_bench.py's do)
                tokens = (list(shared[c % a.groups]) if a.groups
                          else [rng.randrange(1, 30000) for _ in range(16 * a.system_blocks)])
                async with (contextlib.nullcontext() if a.per_turn else sem):
                    for turn in range(a.turns):
                        # --per-turn: the slot is held a turn, so a chat's next turn queues behind the others'
                        async with (sem if a.per_turn else contextlib.nullcontext()):
                            tokens = tokens + [rng.randrange(1, 30000) for _ in range(16 * a.grow)]
                            start = time.perf_counter()  # the pick's own cost counts
                            for i, f in enumerate(followers):
                                view.update(f"r{i}", ReplicaCache(frozenset(f.blocks.blocks), 16))
                            key = RequestKey(blocks=text_blocks(tokens), tokens=tuple(tokens))
                            ep, lacking = policy.pick("m", eps, load=dict(load), key=key)
                            assert ep is not None
                            ticket = policy.routed("m", "vllm", ep.replica_id, lacking, key, stream=True)
                            load[ep.replica_id] += 1
                            try:
                                async with client.stream("POST", ep.url + "/v1/completions", json={
                                        "model": "m", "prompt": tokens, "max_tokens": 4, "stream": True}) as r:
                                    async for _ in r.aiter_lines():
                                        if turn > 0:
                                            ttfts.append(time.perf_counter() - start)
                                        break
                            finally:
                                load[ep.replica_id] -= 1
                                if ticket is not None:
                                    policy.done(ticket)
                            tokens = tokens + [rng.randrange(1, 30000) for _ in range(16 * a.answer)]  # the answer

            await asyncio.gather(*(chat(c) for c in range(a.conversations)))
            hits = queries = 0
            for u in urls:
                stats = (await client.get(u + "/sim/stats")).json()
                hits += stats.get("kv_hits", 0)
                queries += stats.get("kv_queries", 0)
        q = statistics.quantiles(ttfts, n=10)
        return {"p50_ms": statistics.median(ttfts) * 1e3, "p90_ms": q[8] * 1e3, "hit_rate": hits / max(queries, 1),
                "n": len(ttfts)}
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for f in followers:
            f.close()
        for s in sims:
            s.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system-blocks", type=int, default=8)
    ap.add_argument("--grow", type=int, default=2)
    ap.add_argument("--answer", type=int, default=1, help="blocks standing in for each answer")
    ap.add_argument("--groups", type=int, default=0, help="shared system prompts (0: one per conversation)")
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--prefill-tps", type=float, default=2000)
    ap.add_argument("--parallel", type=int, default=64,
                    help="requests an engine serves at once (1: one prefill at a time, as one CPU core does)")
    ap.add_argument("--per-turn", action="store_true",
                    help="every chat open at once, --concurrency turns at a time: chats idle between turns")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        print("| policy | later-turn TTFT p50 | p90 | engines' hit rate | turns |\n|---|---|---|---|---|")
        for name in a.only or ("round_robin", "prefix_cache", "kv_aware"):
            r = asyncio.run(run_policy(name, a, Path(d)))
            print(f"| {name} | {r['p50_ms']:.1f} ms | {r['p90_ms']:.1f} ms | {r['hit_rate']:.0%} | {r['n']:.0f} |")


if __name__ == "__main__":
    main()
