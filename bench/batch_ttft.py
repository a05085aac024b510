"""Interactive TTFT with and without a concurrent batch (issue 32), same run, the sim engine at a fixed capacity.

The sim engine runs as a process of its own (``--parallel`` slots, ``--decode-tps`` per request: a fixed capacity);
the router with its batch runner and the control plane's batch service (a real SQLite store) run in this process,
as in ``llmgw server``; the interactive load comes from another process (open loop: Poisson arrivals at ``--rate``
requests/s, streamed chats, TTFT measured at the client). Phases alternate, ``--rounds`` times: interactive alone,
then interactive with a large batch running (created at the phase's start, cancelled at its end). Printed: TTFT
p50/p90/p99 of each condition over all its phases, the ratio of the p90s, and the batch lines answered per second.

    .venv/bin/python bench/batch_ttft.py [--rounds 3 --seconds 20 --rate 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.testing.batchcluster import SECRET, batch_cluster, jsonl, line  # noqa: E402
from llmgw.testing.procs import Proc, free_port  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def client(url: str, seconds: float, rate: float, seed: int) -> list[float]:
    """Open-loop streamed chats at ``rate``/s for ``seconds``: each one's TTFT in ms."""
    import openai

    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key=SECRET, max_retries=0, timeout=60)
    rnd = random.Random(seed)
    ttfts: list[float] = []

    async def one(i: int) -> None:
        start = time.perf_counter()
        stream = await oai.chat.completions.create(model="m", stream=True, max_tokens=16,
                                                   messages=[{"role": "user", "content": f"interactive {i}"}])
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttfts.append((time.perf_counter() - start) * 1000)
                break
        async for _ in stream:
            pass

    tasks = []
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(rnd.expovariate(rate))
    await asyncio.gather(*tasks, return_exceptions=True)
    return ttfts


def run_client(url: str, seconds: float, rate: float, seed: int) -> list[float]:
    out = subprocess.run([sys.executable, __file__, "--client", url, "--seconds", str(seconds), "--rate", str(rate),
                          "--seed", str(seed)], capture_output=True, text=True, check=True, cwd=ROOT)
    return [float(x) for x in json.loads(out.stdout.strip().splitlines()[-1])]


async def bench(args: argparse.Namespace) -> None:
    import openai

    tmp = Path(tempfile.mkdtemp(prefix="batch-ttft-"))
    port = free_port()
    sim = Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--model", "m", "--port", str(port), "--parallel",
                      str(args.parallel), "--decode-tps", str(args.decode_tps), "--prefill-tps", "100000"],
                     log_path=tmp / "sim.log")
    try:
        sim.wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
        async with batch_cluster(tmp, engine_url=f"http://127.0.0.1:{port}", concurrency=args.batch_concurrency,
                                 step_s=0.5, limit=args.limit) as c:
            oai = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key=SECRET, max_retries=0)
            f = await oai.files.create(file=("in.jsonl", jsonl([line(f"b{i}") for i in range(args.lines)])),
                                       purpose="batch")
            alone: list[float] = []
            beside: list[float] = []
            done_rates: list[float] = []
            cpu = {"alone": 0.0, "beside": 0.0}  # this process's (router, batch service) CPU seconds per phase
            for r in range(args.rounds):
                c0 = time.process_time()
                alone += await asyncio.to_thread(run_client, c.url, args.seconds, args.rate, 2 * r)
                cpu["alone"] += time.process_time() - c0
                b = await oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                             completion_window="24h")
                while (await oai.batches.retrieve(b.id)).status != "in_progress":  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
                t0, c0 = time.perf_counter(), time.process_time()
                beside += await asyncio.to_thread(run_client, c.url, args.seconds, args.rate, 2 * r + 1)
                cpu["beside"] += time.process_time() - c0
                done = (await oai.batches.retrieve(b.id)).request_counts.completed
                done_rates.append(done / (time.perf_counter() - t0))
                await oai.batches.cancel(b.id)
                while (await oai.batches.retrieve(b.id)).status != "cancelled":  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
    finally:
        sim.stop()
    print(f"sim: --parallel {args.parallel} --decode-tps {args.decode_tps}; interactive {args.rate}/s streamed "
          f"max_tokens 16; batch concurrency {args.batch_concurrency}; model limit {args.limit or 'none'}; "
          f"{args.rounds} rounds of {args.seconds:g} s each")
    print("| condition | requests | TTFT p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, xs in (("interactive alone", alone), ("interactive + batch", beside)):
        print(f"| {name} | {len(xs)} | {statistics.median(xs):.1f} | {pct(xs, 90):.1f} | {pct(xs, 99):.1f} |")
    span = args.rounds * args.seconds
    print(f"p90 ratio (with/without): {pct(beside, 90) / pct(alone, 90):.3f}; batch lines answered during the "
          f"with-batch phases: {statistics.mean(done_rates):.1f}/s; the router process's CPU: "
          f"{cpu['alone'] / span * 100:.0f}% of a core alone, {cpu['beside'] / span * 100:.0f}% with the batch; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=8.0, help="interactive requests per second (open loop)")
    p.add_argument("--parallel", type=int, default=8, help="the sim's slots")
    p.add_argument("--decode-tps", type=float, default=200.0)
    p.add_argument("--batch-concurrency", type=int, default=4)
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--limit", type=int, default=0, help="the model's concurrency_per_replica (0: none)")
    p.add_argument("--client", default="", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(client(args.client, args.seconds, args.rate, args.seed))))
    else:
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
