"""Fair queuing against first come first served (issue 32): a light project's TTFT beside a heavy one and a batch.

One sim engine at a fixed capacity (``--parallel 4`` slots, 100 tokens/s each; 20 tokens a request, so ~20
requests a second in all), behind two standalone routers over the same table (the model's concurrency 4, the
engine's slots): ``fair`` (``--admission-order fair``, the default) and ``fifo`` (``--admission-order fifo``). Keys
in three projects: ``heavy`` sends ``--heavy-rps`` (open loop, Poisson), ``light`` a tenth of it, and ``bulk`` (its
project's class ``batch``) keeps ``--batch`` requests in flight (closed loop). Offered load is above capacity, so
the admission queue forms. Each phase runs ``--seconds`` on one router, the routers alternating over ``--rounds``
(a slower minute of the machine falls on both), with a pause between phases for the queue to drain.

Per project and mode: streamed requests' TTFT (send to first token) p50/p90 of those answered, and how many were
refused (429: the queue full or ``--admission-wait`` out). Batch: requests completed.

    .venv/bin/python bench/fair_share.py [--heavy-rps 25] [--seconds 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmgw.testing.routed import Spawner

SECRETS = {"heavy": "sk-heavy-bench-0001", "light": "sk-light-bench-0001", "bulk": "sk-bulk-bench-0001"}
MAX_TOKENS = 20


def table(sim: str) -> dict[str, object]:
    keys = [{"id": name, "sha256": hashlib.sha256(secret.encode()).hexdigest(), "project": name}
            for name, secret in SECRETS.items()]
    return {"version": 1, "auth": {"required": True, "keys": keys,
                                   "projects": [{"name": "bulk", "limits": {}, "priority_class": "batch"}]},
            "models": [{"name": "m", "state": "Ready", "routing": "round_robin", "limits": {"concurrency": 4},
                        "endpoints": [{"replica_id": "m-0", "url": sim}]}]}


class Phase:
    def __init__(self) -> None:
        self.ttft: dict[str, list[float]] = {n: [] for n in SECRETS}
        self.refused: dict[str, int] = dict.fromkeys(SECRETS, 0)
        self.failed: dict[str, int] = dict.fromkeys(SECRETS, 0)
        self.completed: dict[str, int] = dict.fromkeys(SECRETS, 0)


async def request(client: httpx.AsyncClient, router: str, who: str, phase: Phase) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": MAX_TOKENS, "stream": True}
    start = time.monotonic()
    try:
        async with client.stream("POST", router + "/v1/completions", json=body,
                                 headers={"Authorization": f"Bearer {SECRETS[who]}"}) as r:
            if r.status_code == 429:
                phase.refused[who] += 1
                return
            if r.status_code != 200:
                phase.failed[who] += 1
                return
            first = True
            async for chunk in r.aiter_bytes():
                if first and b'"text"' in chunk:
                    phase.ttft[who].append(time.monotonic() - start)
                    first = False
            phase.completed[who] += 1
    except httpx.HTTPError:
        phase.failed[who] += 1


async def run_phase(router: str, args: argparse.Namespace, seed: int) -> Phase:
    phase = Phase()
    rng = random.Random(seed)
    end = time.monotonic() + args.seconds
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []

        async def open_loop(who: str, rps: float) -> None:
            while (now := time.monotonic()) < end:
                tasks.append(asyncio.create_task(request(client, router, who, phase)))
                await asyncio.sleep(max(0.0, rng.expovariate(rps) - (time.monotonic() - now)))

        async def closed_loop() -> None:
            while time.monotonic() < end:
                await request(client, router, "bulk", phase)

        await asyncio.gather(open_loop("heavy", args.heavy_rps), open_loop("light", args.heavy_rps / 10),
                             *(closed_loop() for _ in range(args.batch)))
        await asyncio.gather(*tasks)
    return phase


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heavy-rps", type=float, default=25.0)
    parser.add_argument("--batch", type=int, default=4, help="batch requests kept in flight")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--wait", type=float, default=5.0, help="the routers' --admission-wait")
    args = parser.parse_args()
    spawner = Spawner(Path(tempfile.mkdtemp(prefix="llmgw-fairshare-")))
    try:
        proc, sim = spawner.spawn_sim("m", "--parallel", "4", "--decode-tps", "100")
        proc.wait_http(sim + "/health", timeout=30)
        keyed = lambda status, _body: status == 401  # noqa: E731  (served, and it wants a key)
        routers = {mode: spawner.spawn_router("--admission-wait", str(args.wait), "--admission-order", mode,
                                              "--log-level", "warning", table=table(sim), expect=keyed)
                   for mode in ("fair", "fifo")}
        merged = {mode: Phase() for mode in routers}
        for r in range(args.rounds):
            for mode, url in routers.items():
                phase = asyncio.run(run_phase(url, args, seed=r))
                m = merged[mode]
                for who in SECRETS:
                    m.ttft[who] += phase.ttft[who]
                    m.refused[who] += phase.refused[who]
                    m.failed[who] += phase.failed[who]
                    m.completed[who] += phase.completed[who]
                print(f"round {r + 1} {mode}: light TTFT p90 {pct(phase.ttft['light'], 90):.3f}s "
                      f"({phase.refused['light']} refused), heavy p90 {pct(phase.ttft['heavy'], 90):.3f}s "
                      f"({phase.refused['heavy']} refused), batch completed {phase.completed['bulk']}", flush=True)
                time.sleep(args.wait + 1)  # the queue drains before the other router's phase
        print(f"\n{args.rounds} rounds of {args.seconds:g}s per mode; heavy {args.heavy_rps:g} rps, light "
              f"{args.heavy_rps / 10:g} rps (open loop), batch {args.batch} in flight; capacity ~20 rps")
        print("| mode | project | answered | refused (429) | TTFT p50 (s) | TTFT p90 (s) |")
        print("|---|---|---|---|---|---|")
        for mode, m in merged.items():
            for who in ("light", "heavy", "bulk"):
                t = m.ttft[who]
                print(f"| {mode} | {who} | {m.completed[who]} | {m.refused[who]} | "
                      f"{statistics.median(t) if t else float('nan'):.3f} | {pct(t, 90):.3f} |")
    finally:
        spawner.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
