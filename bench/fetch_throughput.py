"""The agent's fetcher against ``curl -o`` from the same loopback server, on the same bytes, in one run.

    .venv/bin/python bench/fetch_throughput.py                      # 2 GiB file + 50 x 4 MiB directory, N=3
    .venv/bin/python bench/fetch_throughput.py --size 512MiB --runs 5 --json /tmp/fetch.json

Cases (each run deletes its output and calls sync() before the next; fetcher and curl alternate, the first
of each pair switching every run; the figure is the median of --runs):

* ``http``: one --size file (seeded random, written once) as ``http://127.0.0.1:PORT/big.bin`` from
  ``llmgw.testing.flakyhttp`` (no faults, sendfile) in a process of its own, so the server shares no GIL with
  the fetcher. The fetcher is given its sha256 and checks it: verification is part of its fetch. curl checks
  nothing, so a second peer is ``curl`` then ``sha256sum`` on its file (a verified copy, ``curl+sha``).
* ``mirror-file``: the same file as ``mirror://big/big.bin`` from an ``llmgw mirror`` process (size checked:
  the mirror's listing carries no sha256).
* ``http-nosha`` (only when named in --cases): ``http`` without the sha256, so size alone is checked: by
  difference, what verification costs.
* ``mirror-dir``: ``mirror://pack``, --files files of --file-size from the same mirror. Two peers: one
  ``curl`` fetching every URL in turn (one connection), and one ``curl -Z --parallel-max P`` with P the fetcher's
  own ``parallel_files`` (4), the fairest peer for a fetcher that runs that many files at once.

The fetcher runs in this process (``Fetcher.ensure`` into a fresh cache, timed from before the call to its
return, its client made inside); curl is timed around its process. The page cache keeps the served file warm
for both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from llmgw.agent import fetch
from llmgw.core import sources
from llmgw.testing import flakyhttp, hfrepo, procs

MIB = 2**20
PARALLEL = 4   # Fetcher's parallel_files default: the -Z peer uses as many connections
CURL = ["curl", "-sSf", "--noproxy", "*"]


def size_arg(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B?)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected bytes or a size like 512MiB, 2GiB")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[unit])


def serve(root: Path, port_file: Path) -> None:
    """The child: FlakyHttp serving ``root`` until SIGTERM, its URL written to ``port_file``."""
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    with flakyhttp.FlakyHttp(root) as srv:
        port_file.write_text(srv.url)
        while not stop:
            time.sleep(0.2)


def settle(path: Path) -> None:
    """Delete a run's output and flush dirty pages, so the next run neither pays nor skips this one's writeback."""
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def fetcher_run(req: fetch.Request, cache: Path, want_bytes: int) -> float:
    async def go() -> tuple[float, str]:
        f = fetch.Fetcher(cache)
        try:
            t0 = time.perf_counter()
            path = await f.ensure(req)
            return time.perf_counter() - t0, path
        finally:
            await f.close()
    elapsed, path = asyncio.run(go())
    got = Path(path)
    size = sum(p.stat().st_size for p in got.rglob("*") if p.is_file()) if got.is_dir() else got.stat().st_size
    assert size == want_bytes, f"fetcher produced {size} bytes, expected {want_bytes}"
    return elapsed


def curl_run(argvs: list[list[str]], out: Path, want_bytes: int) -> float:
    """Runs ``argvs`` one after the other in ``out`` (curl, then a check where one is asked for); seconds."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for argv in argvs:
        # Output captured: `curl -Z` draws its progress meter even with -s; its errors are shown on failure.
        done = subprocess.run(argv, timeout=3600, cwd=out, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    elapsed = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size == want_bytes, f"curl produced {size} bytes, expected {want_bytes}"
    return elapsed


def measure(name: str, total: int, runs: int, sides: dict[str, Callable[[int], float]]) -> dict[str, object]:
    """Alternates the sides for ``runs`` rounds, rotating who goes first; median seconds and MB/s per side."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    for i in range(runs):
        turn = order[i % len(order):] + order[:i % len(order)]
        for side in turn:
            t = sides[side](i)
            times[side].append(t)
            print(f"  {name} run {i + 1}/{runs} {side}: {t:.2f} s, {total / t / 1e6:.0f} MB/s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"case": name, "bytes": total, "seconds": times, "median_s": med,
            "median_mbps": {k: total / v / 1e6 for k, v in med.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=size_arg, default=2 * 2**30, help="the one file's size (default 2GiB)")
    ap.add_argument("--files", type=int, default=50, help="files in the directory case")
    ap.add_argument("--file-size", type=size_arg, default=4 * MIB, help="each directory file's size (default 4MiB)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="http,mirror-file,mirror-dir")
    ap.add_argument("--tmp", type=Path, default=None, help="where the temp dir goes (default: the system's)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port_file)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-fetch-", dir=args.tmp))
    started: list[procs.Proc] = []
    results: list[dict[str, object]] = []
    try:
        data, mroot, out = tmp / "data", tmp / "mirror", tmp / "out"
        t0 = time.perf_counter()
        sha = flakyhttp.write_big(data / "big.bin", args.size)
        (mroot / "files" / "big").mkdir(parents=True)
        os.link(data / "big.bin", mroot / "files" / "big" / "big.bin")
        small = {f"f{i:03d}.bin": os.urandom(args.file_size) for i in range(args.files)}
        hfrepo.write_files(mroot, "pack", small)
        os.sync()
        print(f"wrote {args.size / 2**30:.2f} GiB + {args.files} x {args.file_size / MIB:.1f} MiB "
              f"in {time.perf_counter() - t0:.1f} s under {tmp}", flush=True)

        port_file = tmp / "http.url"
        http = procs.Proc.start([sys.executable, __file__, "--serve", str(data), "--port-file", str(port_file)],
                                log_path=tmp / "http.log")
        started.append(http)
        url = str(procs.wait_for(lambda: port_file.exists() and port_file.read_text(), timeout=30,
                                 what="the http server's URL"))
        port = procs.free_port()
        mirror = procs.Proc.start([sys.executable, "-m", "llmgw", "mirror", "--dir", str(mroot), "--port",
                                   str(port), "--log-level", "warning"], log_path=tmp / "mirror.log")
        started.append(mirror)
        murl = f"http://127.0.0.1:{port}"
        mirror.wait_http(f"{murl}/healthz", timeout=30)

        def fsides(req: fetch.Request, total: int) -> Callable[[int], float]:
            def run(_i: int) -> float:
                try:
                    return fetcher_run(req, out / "cache", total)
                finally:
                    settle(out)
            return run

        def csides(*argvs: list[str], total: int) -> Callable[[int], float]:
            def run(_i: int) -> float:
                try:
                    return curl_run(list(argvs), out / "curl", total)
                finally:
                    settle(out)
            return run

        for case in cases:
            if case == "http":
                req = fetch.Request(source=sources.parse(f"{url}/big.bin"), sha256=sha)
                results.append(measure(case, args.size, args.runs, {
                    "fetcher": fsides(req, args.size),
                    "curl": csides([*CURL, "-o", "big.bin", f"{url}/big.bin"], total=args.size),
                    "curl+sha": csides([*CURL, "-o", "big.bin", f"{url}/big.bin"], ["sha256sum", "big.bin"],
                                       total=args.size)}))
            elif case == "http-nosha":   # not by default: what the sha256 check costs, by difference with http
                req = fetch.Request(source=sources.parse(f"{url}/big.bin"))
                results.append(measure(case, args.size, args.runs, {
                    "fetcher": fsides(req, args.size),
                    "curl": csides([*CURL, "-o", "big.bin", f"{url}/big.bin"], total=args.size)}))
            elif case == "mirror-file":
                req = fetch.Request(source=sources.parse("mirror://big/big.bin"), endpoint=murl)
                results.append(measure(case, args.size, args.runs, {
                    "fetcher": fsides(req, args.size),
                    "curl": csides([*CURL, "-o", "big.bin", f"{murl}/files/big/big.bin"], total=args.size)}))
            elif case == "mirror-dir":
                total = args.files * args.file_size
                pairs = [a for n in sorted(small) for a in (f"{murl}/files/pack/{n}", "-o", n)]
                req = fetch.Request(source=sources.parse("mirror://pack"), endpoint=murl)
                results.append(measure(case, total, args.runs, {
                    "fetcher": fsides(req, total),
                    "curl-seq": csides([*CURL, *pairs], total=total),
                    f"curl-Z{PARALLEL}": csides([*CURL, "-Z", "--parallel-max", str(PARALLEL), *pairs], total=total)}))
            else:
                raise SystemExit(f"unknown case {case!r}: expected http, http-nosha, mirror-file, mirror-dir")
    finally:
        for p in reversed(started):
            p.stop(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{'case':<12} {'bytes':>10} {'peer':<10} {'fetcher MB/s':>13} {'peer MB/s':>10} {'ratio':>6}")
    for r in results:
        mb: dict[str, float] = r["median_mbps"]  # type: ignore[assignment]
        for peer in (k for k in mb if k != "fetcher"):
            print(f"{r['case']:<12} {r['bytes'] / MIB:>8.0f}Mi {peer:<10} {mb['fetcher']:>13.0f} {mb[peer]:>10.0f} "
                  f"{mb['fetcher'] / mb[peer]:>5.2f}x")
    doc = {"runs": args.runs, "size": args.size, "files": args.files, "file_size": args.file_size,
           "parallel_files": PARALLEL, "cpus": os.cpu_count(), "load_avg_end": os.getloadavg(), "results": results}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
