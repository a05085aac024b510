"""``llmgw router --workers N`` against one worker: requests/s and streams/s over every core of the machine.

One ``fast_upstream.py`` (canned answers) per core behind the router, so the upstream is not the limit;
the router runs unpinned with ``--workers 1`` and with each count given, interleaved over ``--rounds``
rounds (the machine's other load moves them alike), and ``wrk -t2 -c64`` posts 1-token chat completions
(whole, then streamed). Nothing is pinned: wrk and the upstreams share the cores with the router, so on a
machine with few cores the ratio is what an operator would see there, below the router's own scaling.
A figure is the median of its rounds; the ratio is to one worker's.

    .venv/bin/python bench/router_workers.py --workers 2 [--rounds 3 --seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import router_capacity
import router_peers

from llmgw.testing.procs import Proc, free_port

HERE = Path(__file__).resolve().parent
MODEL = router_peers.MODEL


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker counts to set against 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk is not installed (`make bench-peers` installs it with apt-get as root)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-workers-"))
    cores = os.cpu_count() or 1
    upstreams: list[Proc] = []
    urls: list[str] = []
    try:
        for i in range(max(2, cores)):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            upstreams.append(Proc.start([sys.executable, str(HERE / "fast_upstream.py"), "--port", str(port),
                                         "--model", MODEL], log_path=workdir / f"upstream-{i}.log"))
        for proc, url in zip(upstreams, urls, strict=True):
            proc.wait_http(url + "/health", timeout=30)
        table = workdir / "table.json"
        table.write_text(json.dumps({"version": 1, "models": [{
            "name": MODEL, "served_name": MODEL, "state": "Ready", "routing": "round_robin",
            "endpoints": [{"replica_id": f"r{i}", "url": u} for i, u in enumerate(urls)]}]}))
        counts = [1, *args.workers]
        runs: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
        scripts = [router_capacity.lua(workdir, "", stream=s) for s in (False, True)]
        for i in range(args.rounds):
            for n in counts:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                proc = Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--port", str(port), "--table-file",
                                   str(table), "--log-level", "warning", "--workers", str(n)],
                                  log_path=workdir / f"router-{n}-{i}.log")
                try:
                    proc.wait_http(url + "/v1/models", timeout=60, expect=lambda s, b: s == 200)
                    time.sleep(1.0)  # every worker listening
                    router_capacity.wrk(url, scripts[0], seconds=1, connections=args.connections, threads=args.threads)
                    whole, stream = (router_capacity.wrk(url, script, seconds=args.seconds,
                                                         connections=args.connections, threads=args.threads)
                                     for script in scripts)
                finally:
                    proc.stop()
                bad = whole["non2xx"] + stream["non2xx"] + stream["incomplete"]
                runs[n].append((whole["rps"], stream["rps"]))
                print(f"round {i + 1}, {n} worker(s): {whole['rps']:.0f} req/s, {stream['rps']:.0f} streams/s"
                      + (f" ({bad:.0f} failed or incomplete)" if bad else ""), flush=True)
        one = (statistics.median(r[0] for r in runs[1]), statistics.median(r[1] for r in runs[1]))
        print(f"\nmedians of {args.rounds} rounds, wrk -t{args.threads} -c{args.connections} -d{args.seconds:g}s, "
              f"{cores} cores, nothing pinned, {len(urls)} upstreams")
        print(f"{'workers':>8} {'req/s':>8} {'x 1':>6} {'streams/s':>10} {'x 1':>6}")
        for n in counts:
            rps, streams = (statistics.median(r[0] for r in runs[n]), statistics.median(r[1] for r in runs[n]))
            print(f"{n:>8} {rps:8.0f} {rps / one[0]:6.2f} {streams:10.0f} {streams / one[1]:6.2f}")
    finally:
        for proc in upstreams:
            proc.stop()
    print(f"logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
