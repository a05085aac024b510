"""llmgw's router against its peers: TTFT added to a streamed request, and (with wrk) capacity on one core.

One sim engine (fast decode, so its own time is small) serves every run. In
front of it, one at a time: no router (direct), llmgw's standalone router,
LiteLLM's proxy, sglang-router and vllm-router (see bench/peers.py for how
each is configured). A contender whose binary is missing is skipped with the
reason. Direct runs first and last, so drift in the machine over the run shows.

Latency: after a warm-up, ``--requests`` streamed chat completions at
concurrency 1 on one keep-alive connection. TTFT is from sending the request to
the first SSE event whose delta has content (a role-only first chunk does not
count), total is to the end of the stream.

Capacity (``--wrk-seconds`` > 0, needs wrk): non-streaming 1-token chat
completions from ``wrk`` with ``--wrk-connections`` connections; the router is
pinned to core 0 and the sim, wrk and this client to core 1, so the router's
req/s is what one core of it gives. The sim is Python, so the direct row is the
ceiling: a router near it is limited by the upstream, not by itself.

    make bench-peers && bench/.venv-peers/bin/python bench/router_peers.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import peers

from llmgw.testing.procs import Proc, free_port

MODEL = "bench-model"


def _has_content(line: bytes) -> bool:
    if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
        return False
    try:
        event = json.loads(line[5:])
        return bool(event["choices"][0]["delta"].get("content"))
    except (ValueError, KeyError, IndexError, TypeError):
        return False


async def one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> tuple[float, float]:
    """(ttft, total) in seconds for one streamed request."""
    start = time.perf_counter()
    ttft = 0.0
    async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not ttft and _has_content(line):
                ttft = time.perf_counter() - start
    if not ttft:
        raise RuntimeError(f"{url}: the stream ended without a content chunk")
    return ttft, time.perf_counter() - start


async def latency(url: str, key: str, *, n: int, warmup: int, max_tokens: int) -> list[tuple[float, float]]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "Say something short."}]}).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        # A router that checks its worker before it routes answers 503 for a moment after it listens.
        deadline = time.monotonic() + 60
        while True:
            try:
                await one(session, url, body, headers)
                break
            except (RuntimeError, aiohttp.ClientError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        for _ in range(warmup):
            await one(session, url, body, headers)
        return [await one(session, url, body, headers) for _ in range(n)]


def wrk(url: str, key: str, *, seconds: int, connections: int, workdir: Path) -> tuple[float, int]:
    """(req/s, non-2xx responses) from wrk on core 1, non-streaming 1-token requests."""
    script = workdir / "post.lua"
    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    auth = f'wrk.headers["Authorization"] = "Bearer {key}"\n' if key else ""
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                      f'wrk.headers["Content-Type"] = "application/json"\n{auth}')
    argv = [*pin(1), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
            url + "/v1/chat/completions"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    if errors:
        print(f"  wrk: {errors.group(0)}")
    return (float(rps.group(1)) if rps else 0.0), (int(bad.group(1)) if bad else 0)


def pin(core: int) -> list[str]:
    """A taskset prefix for ``core`` where there are two cores and taskset, else nothing."""
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(core)]
    return []


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def report(rows: list[tuple[str, list[tuple[float, float]], float, int]], notes: dict[str, str]) -> None:
    direct = [r for r in rows if r[0].startswith("direct")]
    base50 = sum(pct([t for t, _ in r[1]], 50) for r in direct) / len(direct) * 1000
    base99 = sum(pct([t for t, _ in r[1]], 99) for r in direct) / len(direct) * 1000
    added = {name: pct([t for t, _ in s], 50) * 1000 - base50 for name, s, _, _ in rows}
    ours = added.get("llmgw")
    ours_rps = next((rps for name, _, rps, _ in rows if name == "llmgw"), 0.0)
    print(f"\n{'':14} {'n':>4} {'ttft p50':>9} {'ttft p99':>9} {'total p50':>10} {'+ttft p50':>10} "
          f"{'+ttft p99':>10} {'x llmgw':>8} {'req/s':>8} {'x llmgw':>8}  (ms; + is over the mean of the direct rows)")
    for name, samples, rps, bad in rows:
        ttft = [t * 1000 for t, _ in samples]
        total = [t * 1000 for _, t in samples]
        ratio = f"{added[name] / ours:8.1f}" if ours and ours > 0 and not name.startswith("direct") else f"{'':8}"
        cap = f"{rps:8.0f}" if rps else f"{'-':>8}"
        cap += f" {rps / ours_rps:8.2f}" if rps and ours_rps else ""
        if bad:
            cap += f" ({bad} non-2xx)"
        print(f"{name:14} {len(ttft):4d} {pct(ttft, 50):9.2f} {pct(ttft, 99):9.2f} {pct(total, 50):10.2f} "
              f"{pct(ttft, 50) - base50:10.2f} {pct(ttft, 99) - base99:10.2f} {ratio} {cap}")
    for name, note in notes.items():
        print(f"  {name}: {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests per contender")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--decode-tps", type=float, default=100000.0)
    parser.add_argument("--policy", default="round_robin", help="the peers' --policy (one worker either way)")
    parser.add_argument("--only", nargs="*", default=list(peers.NAMES), choices=peers.NAMES)
    parser.add_argument("--wrk-seconds", type=int, default=10, help="0 skips the capacity run")
    parser.add_argument("--wrk-connections", type=int, default=32)
    args = parser.parse_args()

    if args.wrk_seconds and not shutil.which("wrk"):
        print("no capacity run: wrk is not installed (`make bench-peers` installs it with apt-get as root)")
        args.wrk_seconds = 0
    if pin(1):
        os.sched_setaffinity(0, {1})  # this client shares core 1 with the sim, never the router's core 0
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-peers-"))
    sim_port = free_port()
    upstream = f"http://127.0.0.1:{sim_port}"
    rows: list[tuple[str, list[tuple[float, float]], float, int]] = []
    notes: dict[str, str] = {}
    sim = Proc.start([*pin(1), peers.python_for_project(), "-m", "llmgw.sim.engine", "--host", "127.0.0.1",
                      "--port", str(sim_port), "--model", MODEL, "--decode-tps", str(args.decode_tps),
                      "--prefill-tps", "1e7", "--parallel", str(max(8, args.wrk_connections * 2))],
                     log_path=workdir / "sim.log")
    try:
        sim.wait_http(upstream + "/health", timeout=30)
        order = ["direct", *args.only, "direct"]
        for i, name in enumerate(order):
            label = "direct (last)" if name == "direct" and i else "direct (first)" if name == "direct" else name
            proc = None
            url, key = upstream, ""
            if name != "direct":
                found = peers.find(name, upstream=upstream, model=MODEL, workdir=workdir, policy=args.policy)
                if isinstance(found, str):
                    print(f"skipping {name}: {found}")
                    continue
                notes[name] = found.note
                proc = Proc.start([*pin(0), *found.argv], env=found.env, log_path=workdir / f"{name}.log")
                url, key = found.url, found.key
            try:
                if proc is not None:
                    proc.wait_http(url + found.ready_path, timeout=120, expect=lambda s, b: s < 500)
                started = time.monotonic()
                samples = asyncio.run(latency(url, key, n=args.requests, warmup=args.warmup,
                                              max_tokens=args.max_tokens))
                rps, bad = (wrk(url, key, seconds=args.wrk_seconds, connections=args.wrk_connections,
                                workdir=workdir) if args.wrk_seconds else (0.0, 0))
                print(f"{label}: {len(samples)} requests in {time.monotonic() - started:.1f}s"
                      + (f", {rps:.0f} req/s" if rps else ""))
                rows.append((label, samples, rps, bad))
            except (RuntimeError, TimeoutError, aiohttp.ClientError, subprocess.SubprocessError) as exc:
                print(f"{label} failed: {exc}\n  log: {proc.log_path if proc else sim.log_path}")
            finally:
                if proc is not None:
                    proc.stop()
        print(f"\n{args.requests} streamed chat requests each, concurrency 1, {args.max_tokens} tokens, "
              f"sim decode {args.decode_tps:g} tok/s; wrk {args.wrk_seconds}s x {args.wrk_connections} "
              f"connections, non-streaming 1 token; logs in {workdir}")
        if any(r[0].startswith("direct") for r in rows):
            report(rows, notes)
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
