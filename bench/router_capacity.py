"""One-core capacity of llmgw's router against its peers, in front of a near-zero-cost upstream.

``bench/fast_upstream.py`` answers canned completions at well over 100k req/s,
so what each row measures is the router, not the engine behind it. The router
runs under ``taskset -c 0``; the upstream, wrk and this script share core 1.
In front of the upstream: nothing (direct), llmgw's standalone router,
vllm-router, sglang-router and LiteLLM (bench/peers.py says how each is
configured; a missing binary is skipped with the reason).

Every router but LiteLLM is started first, and they all idle on core 0 while
one is measured (LiteLLM keeps core 0 busy for a while after it starts, so it
runs alone afterwards, one round); after ``--settle`` seconds, ``--rounds``
rounds each measure every contender in turn, and a figure is the median of its
rounds (the best round is printed too). Other load on the machine comes and goes over
minutes; measured one after the other, a router that happened to run during a
busy minute would look slower than it is, while interleaved rounds spread that
over all of them. What each round measures, after a warm-up in the first:

* **non-streaming req/s**: ``wrk -t1 -cN -dS`` posting a 1-token chat completion;
* **streams/s**: the same with ``"stream": true``; the upstream sends a short SSE
  stream (role, two content chunks, a finish chunk with usage, ``data: [DONE]``)
  in chunked encoding and wrk reads each to its end. A Lua ``response`` hook
  counts streams whose body lacks ``data: [DONE]``: a router that cuts streams
  would otherwise look fast;
* **per CPU-second**: each wrk run's requests over the CPU time (utime + stime from
  /proc) the router process spent meanwhile: its one-core capacity had it the core to
  itself, which moves far less than req/s when other work shares the machine;
* **TTFT** (``--latency N`` > 0): N streamed requests at concurrency 1 on one
  keep-alive connection (router_peers.latency), p50 and p99, and what the router
  adds over the direct row's.

Figures are printed as they come and as a table with ratios to llmgw and to
direct. The machine's other load moves absolute numbers; compare within a run.

``--engine llamacpp`` names that engine in llmgw's table, so the router does
what it does for llama.cpp models (asks for prefill progress, splices each
chunk into OpenAI's shape: ``router.openai_shape``). ``--before TREE`` adds a
contender ``llmgw-before``: the router from another checkout (``git worktree
add /tmp/before HEAD``), with the same table, measured in the same rounds, so
a change's cost is a same-run comparison; ``--tree TREE`` runs the ``llmgw`` row
from another checkout too.

    make bench-peers && bench/.venv-peers/bin/python bench/router_capacity.py
    .venv/bin/python bench/router_capacity.py --only llmgw   # without the peers' venv
    .venv/bin/python bench/router_capacity.py --only llmgw --engine llamacpp --before /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import peers
import router_peers

from llmgw.testing.procs import Proc, free_port

MODEL = router_peers.MODEL
HERE = Path(__file__).resolve().parent
#: Measured alone, after the rest (see main).
SOLO = frozenset({"litellm"})

_DONE_CHECK = """
bad = 0
response = function(status, headers, body)
  if status ~= 200 or not string.find(body, "data: [DONE]", 1, true) then bad = bad + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("incomplete streams: %d\\n", bad))
end
"""


def lua(workdir: Path, key: str, *, stream: bool) -> Path:
    """The wrk script posting one chat completion (streamed or not) with ``key``."""
    body = {"model": MODEL, "max_tokens": 1 if not stream else 2, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    auth = f'wrk.headers["Authorization"] = "Bearer {key}"\n' if key else ""
    path = workdir / ("stream.lua" if stream else "post.lua")
    path.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
                    f'wrk.headers["Content-Type"] = "application/json"\n{auth}' + (_DONE_CHECK if stream else ""))
    return path


def wrk(url: str, script: Path, *, seconds: float, connections: int, threads: int = 1) -> dict[str, float]:
    """req/s, non-2xx answers, socket errors and (streams) incomplete streams from one wrk run on core 1."""
    argv = [*router_peers.pin(1), "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script),
            url + "/v1/chat/completions"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    found = {"rps": re.search(r"Requests/sec:\s+([\d.]+)", out),
             "non2xx": re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out),
             "incomplete": re.search(r"incomplete streams: (\d+)", out)}
    result = {name: float(m.group(1)) if m else 0.0 for name, m in found.items()}
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["socket_errors"] = float(sum(int(g) for g in errors.groups())) if errors else 0.0
    done = re.search(r"(\d+) requests in", out)
    result["requests"] = float(done.group(1)) if done else 0.0
    return result


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (from /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_cpu_second(url: str, script: Path, args: argparse.Namespace, pid: int | None) -> dict[str, float]:
    """One wrk run, and (with the router's ``pid``) how many requests it served per second of its own CPU.

    Other load on the machine takes CPU away from the router, which moves req/s; the CPU the
    router spent per request moves much less, so requests per CPU-second is the figure to
    compare across a busy machine's rounds: the one-core capacity if it had the core alone.
    """
    before = cpu_seconds(pid) if pid else 0.0
    result = wrk(url, script, seconds=args.seconds, connections=args.connections, threads=args.threads)
    spent = cpu_seconds(pid) - before if pid else 0.0
    result["per_cpu_s"] = result["requests"] / spent if spent > 0 else 0.0
    return result


def ready(url: str, post: Path) -> None:
    """Wait until ``url`` answers 2xx: a router that checks its worker first answers 503 for a moment."""
    deadline = time.monotonic() + 60
    while wrk(url, post, seconds=1, connections=1)["non2xx"] and time.monotonic() < deadline:
        time.sleep(0.5)


def measure(url: str, key: str, args: argparse.Namespace, workdir: Path, *, warm: bool,
            pid: int | None = None) -> dict[str, float]:
    """One round's req/s, streams/s, both per CPU-second of the router at ``pid``, and failures."""
    post, stream = lua(workdir, key, stream=False), lua(workdir, key, stream=True)
    if warm:
        ready(url, post)
        wrk(url, post, seconds=args.warmup, connections=args.connections, threads=args.threads)
    whole = per_cpu_second(url, post, args, pid)
    streamed = per_cpu_second(url, stream, args, pid)
    return {"rps": whole["rps"], "streams": streamed["rps"], "rss_mib": rss_mib(pid) if pid else 0.0,
            "cpu_rps": whole["per_cpu_s"], "cpu_streams": streamed["per_cpu_s"],
            "bad": whole["non2xx"] + streamed["non2xx"] + whole["socket_errors"] + streamed["socket_errors"]
            + streamed["incomplete"]}


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` and its children (a router's workers), in MiB, from /proc."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(c) for c in children.read_text().split()]
    for one in pids:
        for line in Path(f"/proc/{one}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def latency(url: str, key: str, n: int) -> dict[str, float]:
    samples = asyncio.run(router_peers.latency(url, key, n=n, warmup=min(100, n), max_tokens=2))
    ttft = [t * 1000 for t, _ in samples]
    return {"p50": router_peers.pct(ttft, 50), "p99": router_peers.pct(ttft, 99)}


def median_row(rounds: list[dict[str, float]]) -> dict[str, float]:
    row = {k: statistics.median(r[k] for r in rounds) for k in ("rps", "streams", "cpu_rps", "cpu_streams")}
    # The best round too: the machine's other load only ever takes capacity away.
    row.update({f"best_{k}": max(r[k] for r in rounds) for k in ("rps", "streams")})
    row["bad"] = sum(r["bad"] for r in rounds)
    row["rss_mib"] = max(r.get("rss_mib", 0.0) for r in rounds)
    return row


def report(rows: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    direct = [r for n, r in rows.items() if n.startswith("direct")]
    ours = rows.get("llmgw")
    print(f"\nmedians of {args.rounds} rounds of wrk -t{args.threads} -c{args.connections} -d{args.seconds:g}s; "
          f"router on core 0, {args.upstreams} upstream(s) and wrk on core 1"
          f"{f'; TTFT over {args.latency} streamed requests at concurrency 1' if args.latency else ''}")
    head = (f"{'':16} {'req/s':>8} {'x llmgw':>8} {'x direct':>8} {'streams/s':>10} {'x llmgw':>8} {'x direct':>8}"
            f" {'best req/s':>10} {'x llmgw':>8} {'best str/s':>10} {'x llmgw':>8}")
    head += f" {'req/cpu-s':>10} {'x llmgw':>8} {'str/cpu-s':>10} {'x llmgw':>8} {'RSS MiB':>8} {'x llmgw':>8}"
    if args.latency:
        head += f" {'ttft p50':>9} {'ttft p99':>9} {'+p50':>7} {'+p99':>7}"
    print(head)
    base = {k: sum(r[k] for r in direct) / len(direct) for k in direct[0]} if direct else {}
    for name, row in rows.items():
        def ratio(key: str, of: dict[str, float] | None, row: dict[str, float] = row) -> str:
            return f"{row[key] / of[key]:8.2f}" if of and of.get(key) else f"{'-':>8}"
        line = (f"{name:16} {row['rps']:8.0f} {ratio('rps', ours)} {ratio('rps', base)} {row['streams']:10.0f} "
                f"{ratio('streams', ours)} {ratio('streams', base)} {row['best_rps']:10.0f} {ratio('best_rps', ours)} "
                f"{row['best_streams']:10.0f} {ratio('best_streams', ours)} {row['cpu_rps']:10.0f} "
                f"{ratio('cpu_rps', ours)} {row['cpu_streams']:10.0f} {ratio('cpu_streams', ours)}"
                f" {row.get('rss_mib', 0):8.1f} {ratio('rss_mib', ours)}")
        if args.latency and "p50" in row:
            added = ("" if name.startswith("direct") or not base else
                     f" {row['p50'] - base['p50']:7.3f} {row['p99'] - base['p99']:7.3f}")
            line += f" {row['p50']:9.3f} {row['p99']:9.3f}{added}"
        if row.get("bad"):
            line += f"  ({row['bad']:.0f} failed or incomplete)"
        print(line)


def llmgw_variant(found: peers.Contender, name: str, args: argparse.Namespace,
                  workdir: Path, engine: str) -> tuple[peers.Contender, Path | None]:
    """llmgw's contender with ``--engine`` in its table, run from ``--tree`` (``llmgw-before``: ``--before``)."""
    argv = list(found.argv)
    at = argv.index("--table-file") + 1
    table = json.loads(Path(argv[at]).read_text())
    for model in table["models"]:
        model["engine"] = engine
    argv[at] = str(workdir / f"{name}-{engine or 'none'}-table.json")
    Path(argv[at]).write_text(json.dumps(table))
    other = args.before if name == "llmgw-before" else args.tree
    # The worker count by variable, not flag: a checkout from before ``--workers`` ignores it.
    workers = {"LLMGW_ROUTER_WORKERS": str(args.workers)}
    if not other:
        return dataclasses.replace(found, name=name, argv=argv, env={**(found.env or os.environ), **workers}), None
    tree = Path(other).resolve()
    # PYTHONPATH before the venv's editable install, and the tree as the working directory
    # (``-m`` puts it first on sys.path): the router's modules come from the other checkout.
    env = {**(found.env or os.environ), "PYTHONPATH": str(tree), **workers}
    return dataclasses.replace(found, name=name, argv=argv, env=env), tree


def run_group(names: list[str], args: argparse.Namespace, upstream_urls: list[str], workdir: Path, *,
              rounds: int, engine: str = "") -> dict[str, dict[str, float]]:
    """Start ``names`` together, let them settle, measure each in interleaved rounds, stop them."""
    procs: list[Proc] = []
    contenders: dict[str, tuple[str, str, int | None]] = {}
    try:
        for name in names:
            if name == "direct":
                contenders[name] = (upstream_urls[0], "", None)
                continue
            kind = "llmgw" if name.startswith("llmgw") else name
            found = peers.find(kind, upstream=upstream_urls, model=MODEL, workdir=workdir, policy=args.policy)
            if isinstance(found, str):
                print(f"skipping {name}: {found}")
                continue
            cwd = None
            if kind == "llmgw":
                found, cwd = llmgw_variant(found, name, args, workdir, engine)
            proc = Proc.start([*router_peers.pin(0), *found.argv], env=found.env, log_path=workdir / f"{name}.log",
                              cwd=cwd)
            procs.append(proc)
            try:
                proc.wait_http(found.url + found.ready_path, timeout=120, expect=lambda s, b: s < 500)
            except (TimeoutError, RuntimeError) as exc:
                print(f"skipping {name}: it did not start: {exc}\n  log: {proc.log_path}")
                continue
            contenders[name] = (found.url, found.key, proc.pid)
        time.sleep(args.settle)  # start-up work done before anything is measured
        measured: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        for i in range(rounds):
            for name, (url, key, pid) in contenders.items():
                try:
                    one = measure(url, key, args, workdir, warm=i == 0, pid=pid)
                except (OSError, subprocess.SubprocessError) as exc:
                    print(f"{name} failed in round {i + 1}: {exc}")
                    continue
                measured[name].append(one)
                print(f"round {i + 1} {name}: {one['rps']:.0f} req/s, {one['streams']:.0f} streams/s; per CPU-second "
                      f"{one['cpu_rps']:.0f} and {one['cpu_streams']:.0f}"
                      + (f" ({one['bad']:.0f} failed or incomplete)" if one["bad"] else ""), flush=True)
        rows: dict[str, dict[str, float]] = {}
        for name, (url, key, _) in contenders.items():
            if not measured[name]:
                continue
            rows[name] = median_row(measured[name])
            if args.latency:
                rows[name].update(latency(url, key, args.latency))
                print(f"{name}: TTFT p50 {rows[name]['p50']:.3f} ms, p99 {rows[name]['p99']:.3f} ms", flush=True)
        return rows
    finally:
        for proc in procs:
            proc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=["llmgw", "vllm-router", "sglang-router", "litellm"],
                        choices=peers.NAMES)
    parser.add_argument("--seconds", type=float, default=4.0, help="each wrk figure's duration")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every contender; figures are medians")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between start-up and measuring")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk's threads (all on core 1)")
    parser.add_argument("--upstreams", type=int, default=2, help="fast upstreams behind every router (round robin)")
    parser.add_argument("--latency", type=int, default=1000, help="streamed requests for TTFT (0: skip)")
    parser.add_argument("--policy", default="round_robin",
                        help="the peers' --policy and llmgw's routing (llmgw's default is prefix_cache)")
    parser.add_argument("--engine", nargs="*", default=[""],
                        help="the engine(s) llmgw's table names, one run each (llamacpp: its splices; the "
                             "upstreams then write llama.cpp's bytes, for the peers too)")
    parser.add_argument("--workers", type=int, default=1, help="llmgw's --workers (LLMGW_ROUTER_WORKERS)")
    parser.add_argument("--before", metavar="TREE",
                        help="also measure llmgw from this checkout (a git worktree) as llmgw-before")
    parser.add_argument("--tree", metavar="TREE",
                        help="run the llmgw row from this checkout rather than the venv's (a shared working tree "
                             "holds others' unfinished work: a worktree with only the change measured)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk is not installed (`make bench-peers` installs it with apt-get as root)", file=sys.stderr)
        return 2
    if router_peers.pin(1):
        os.sched_setaffinity(0, {1})  # this script's latency client shares core 1, never the router's core 0
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-capacity-"))
    for engine in args.engine:
        if len(args.engine) > 1:
            print(f"\n== the table's engine: {engine or '(none)'}", flush=True)
        one_engine(args, workdir, engine)
    print(f"logs in {workdir}")
    return 0


def one_engine(args: argparse.Namespace, workdir: Path, engine: str) -> None:
    """Every contender in front of ``args.upstreams`` fast upstreams writing ``engine``'s bytes."""
    upstreams: list[Proc] = []
    urls: list[str] = []
    try:
        for i in range(args.upstreams):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            upstreams.append(Proc.start(
                [*router_peers.pin(1), peers.python_for_project(), str(HERE / "fast_upstream.py"), "--port",
                 str(port), "--model", MODEL,
                 # llama.cpp's own bytes when llmgw treats the upstream as llama.cpp.
                 "--order", "llamacpp" if engine == "llamacpp" else "openai"],
                log_path=workdir / f"upstream-{engine or 'none'}-{i}.log"))
        for proc, url in zip(upstreams, urls, strict=True):
            proc.wait_http(url + "/health", timeout=30)
        rows: dict[str, dict[str, float]] = {}
        # LiteLLM measured alone, after the others: idle, it still runs background work on
        # core 0 for a while after it starts, which took up to a third off the others' first round.
        together = [n for n in args.only if n not in SOLO]
        if args.before and "llmgw" in together:
            together.insert(together.index("llmgw") + 1, "llmgw-before")
        rows.update(run_group(["direct", *together], args, urls, workdir, rounds=args.rounds, engine=engine))
        for name in args.only:
            if name in SOLO:
                rows.update(run_group([name], args, urls, workdir, rounds=1, engine=engine))
        if rows:
            report(rows, args)
    finally:
        for proc in upstreams:
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
