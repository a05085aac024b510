"""What the router adds to a streamed request: TTFT and total time, direct to the engine and via the router.

Starts one sim engine (fast decode, so the engine's own time is small and the
router's share shows) and one router over a static table, then sends streaming
chat requests at concurrency 1 (``--concurrency`` for more), alternating direct
and routed requests so drift in the machine's load hits both paths alike.
TTFT is the time from sending the request to the first body byte, which from
the sim is the first content chunk.

    .venv/bin/python bench/router_overhead.py --requests 300
    .venv/bin/python bench/router_overhead.py --requests 2000 --before /tmp/old   # a second router, old code

``--before DIR`` starts a second router from the tree at DIR (its ``llmgw`` package first on
PYTHONPATH, e.g. ``git archive HEAD llmgw | tar -x -C DIR``) and alternates all three paths request
by request, so a change's cost is read from one run: the "before" row against the "router" row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from llmgw.testing.procs import Proc, free_port

MODEL = "bench-model"
KEY = "bench-engine-key"


async def one(session: aiohttp.ClientSession, base: str, body: bytes, headers: dict[str, str]) -> tuple[float, float]:
    """(ttft, total) in seconds for one streamed request."""
    start = time.perf_counter()
    ttft = 0.0
    async with session.post(base + "/v1/chat/completions", data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{base}: HTTP {resp.status}: {await resp.text()}")
        async for chunk in resp.content.iter_any():
            if not ttft and chunk:
                ttft = time.perf_counter() - start
    return ttft, time.perf_counter() - start


async def worker(paths: list[tuple[str, str]], body: bytes, n: int, i0: int,
                 out: dict[str, list[tuple[float, float]]]) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            # Rotate which path goes first, so none always runs on a warmer machine.
            k = (i + i0) % len(paths)
            order = paths[k:] + paths[:k]
            if (i + i0) % 2:
                order.reverse()
            for name, base in order:
                out[name].append(await one(session, base, body, headers))


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def report(out: dict[str, list[tuple[float, float]]]) -> None:
    print(f"{'':8} {'n':>5} {'ttft p50':>9} {'ttft p99':>9} {'total p50':>10} {'total p99':>10}  (ms)")
    rows = {}
    for name in out:
        ttft = [t * 1000 for t, _ in out[name]]
        total = [t * 1000 for _, t in out[name]]
        rows[name] = (pct(ttft, 50), pct(ttft, 99), pct(total, 50), pct(total, 99), statistics.mean(ttft))
        print(f"{name:8} {len(ttft):5d} {rows[name][0]:9.2f} {rows[name][1]:9.2f} {rows[name][2]:10.2f} "
              f"{rows[name][3]:10.2f}")
    d, r = rows["direct"], rows["router"]
    print(f"{'added':8} {'':5} {r[0] - d[0]:9.2f} {r[1] - d[1]:9.2f} {r[2] - d[2]:10.2f} {r[3] - d[3]:10.2f}")
    print(f"{'ratio':8} {'':5} {r[0] / d[0]:9.2f} {r[1] / d[1]:9.2f} {r[2] / d[2]:10.2f} {r[3] / d[3]:10.2f}")
    if "before" in rows:
        b = rows["before"]
        print(f"{'before+':8} {'':5} {b[0] - d[0]:9.2f} {b[1] - d[1]:9.2f} {b[2] - d[2]:10.2f} {b[3] - d[3]:10.2f}"
              "  (the old code's added time)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per path")
    parser.add_argument("--concurrency", type=int, default=1, help="clients at once, each alternating paths")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--decode-tps", type=float, default=100000.0)
    parser.add_argument("--warmup", type=int, default=20, help="requests per path not counted")
    parser.add_argument("--before", type=Path, default=None,
                        help="a tree holding an older llmgw package: a second router runs it, alternated too")
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    sim_port, router_port = free_port(), free_port()
    sim_url, router_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{router_port}"
    table = {"version": 1, "models": [{"name": MODEL, "served_name": MODEL, "state": "Ready",
                                       "endpoints": [{"replica_id": "r-bench", "url": sim_url, "api_key": KEY}]}]}
    (logs / "table.json").write_text(json.dumps(table))
    procs: list[Proc] = []
    try:
        procs.append(Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--port", str(sim_port), "--model", MODEL,
                                 "--api-key", KEY, "--decode-tps", str(args.decode_tps), "--prefill-tps", "1e7",
                                 "--parallel", str(max(8, args.concurrency))], log_path=logs / "sim.log"))
        procs.append(Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--port", str(router_port),
                                 "--table-file", str(logs / "table.json"), "--log-level", "warning",
                                 "--workers", "1"],
                                log_path=logs / "router.log"))
        procs[0].wait_http(sim_url + "/health", timeout=30)
        procs[1].wait_http(router_url + "/v1/models", timeout=30)
        paths = [("direct", sim_url), ("router", router_url)]
        if args.before is not None:
            before_port = free_port()
            env = {**os.environ, "PYTHONPATH": f"{args.before.resolve()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            procs.append(Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--port", str(before_port),
                                     "--table-file", str(logs / "table.json"), "--log-level", "warning"],
                                    # -m puts the working directory first on sys.path: run it there too
                                    env=env, cwd=args.before, log_path=logs / "router-before.log"))
            procs[2].wait_http(f"http://127.0.0.1:{before_port}/v1/models", timeout=30)
            paths.append(("before", f"http://127.0.0.1:{before_port}"))
        body = json.dumps({"model": MODEL, "stream": True, "max_tokens": args.max_tokens,
                           "messages": [{"role": "user", "content": "Say something short."}]}).encode()

        async def run(n: int) -> dict[str, list[tuple[float, float]]]:
            out: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in paths}
            per = -(-n // args.concurrency)
            await asyncio.gather(*(worker(paths, body, per, w, out)
                                   for w in range(args.concurrency)))
            return out

        asyncio.run(run(args.warmup))
        started = time.monotonic()
        out = asyncio.run(run(args.requests))
        print(f"{args.requests} streamed chat requests per path, concurrency {args.concurrency}, "
              f"{args.max_tokens} tokens each, sim decode {args.decode_tps:g} tok/s "
              f"({time.monotonic() - started:.1f}s)")
        report(out)
    finally:
        for proc in procs:
            proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
