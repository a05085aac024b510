"""Where the router's time goes: µs of its one core per request, stage by stage, and the ratio to a pure relay.

The regression guard of issue 27 (``make bench-costs``): a change that adds a microsecond per
request shows here in review. For each case (the table's engine, a whole answer or a stream) the
standalone router runs pinned to core 0 in front of ``fast_upstream.py`` (canned answers, core 1),
``wrk`` loads it at capacity (core 1), and meanwhile:

* the router's CPU time (utime + stime from /proc) over the requests served gives **µs of CPU per
  request**, the figure that moves least on a shared machine;
* ``py-spy`` samples its stacks (``--nonblocking``, so it does not stop the process); each sample is
  given to one stage by its innermost frame that a rule below names (``STAGES``), so a stage's
  share of samples times the CPU per request is that stage's µs per request. Time in the kernel
  (a ``write`` to a socket) is inside the Python frame that made the call, so it counts for that
  frame's stage; the event loop's own work (epoll, reading sockets, running callbacks) is its stage.

``pure_relay.py`` (bytes copied between client and upstream, nothing else) runs in the same
conditions: llmgw's CPU per request over the relay's is what its features and structure cost.

    make bench-costs                                # = .venv/bin/python bench/router_costs.py
    .venv/bin/python bench/router_costs.py --before /work/before27   # and a checkout to compare, interleaved
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import router_capacity
import router_peers

from llmgw.testing.procs import Proc, free_port

HERE = Path(__file__).resolve().parent
MODEL = router_peers.MODEL

#: (file suffix, function names or None for any, stage): the first rule matching a sample's innermost
#: llmgw frame names its stage; frames of the standard library (json, asyncio, contextlib) count for the
#: llmgw frame that called them.
STAGES: tuple[tuple[str, tuple[str, ...] | None, str], ...] = (
    ("router/connection.py", None, "accept and parse"),
    ("router/request.py", None, "accept and parse"),
    ("router/asgi.py", ("read_body",), "accept and parse"),
    ("router/auth.py", None, "auth and key lookup"),
    ("router/keyuse.py", None, "auth and key lookup"),
    ("router/table.py", None, "auth and key lookup"),
    ("router/ratelimit.py", None, "limits and admission"),
    ("router/admission.py", None, "limits and admission"),
    ("router/quota.py", None, "limits and admission"),
    ("router/budgets.py", None, "limits and admission"),
    ("core/fairqueue.py", None, "limits and admission"),  # issue 32: only when a queue forms
    ("core/queueclasses.py", None, "limits and admission"),  # only with X-Llmgw-Priority
    ("router/queuemetrics.py", None, "limits and admission"),  # only when a queue forms
    ("router/pick.py", None, "pick"),
    ("router/adaptercache.py", None, "pick"),
    ("core/adapteraffinity.py", None, "pick"),
    ("router/prefix.py", None, "pick"),
    ("router/loadwatch.py", None, "pick"),
    ("router/hung.py", None, "pick"),
    ("router/upstream.py", ("_pick", "_order"), "pick"),
    ("/policies/", None, "pick"),
    ("router/client.py", ("send",), "write upstream"),
    ("router/client.py", ("data_received", "on_header", "on_headers_complete", "on_body", "on_message_complete",
                          "on_status", "on_message_begin", "on_chunk_header", "on_chunk_complete"), "read upstream"),
    ("router/response.py", None, "read upstream"),
    ("router/client.py", None, "upstream connect and reuse"),
    ("router/enginetls.py", None, "upstream connect and reuse"),  # per connection to an https:// engine only
    ("router/upstream.py", None, "upstream connect and reuse"),
    ("router/openai_shape.py", None, "shape"),
    ("router/httphead.py", None, "write to client"),
    ("router/relay.py", None, "relay"),
    ("router/asgi.py", None, "relay"),
    ("router/metering.py", None, "metering and signals"),
    ("router/signals.py", None, "metering and signals"),
    ("router/reports.py", None, "metering and signals"),
    ("router/usagejournal.py", None, "metering and signals"),
    ("router/metrics.py", None, "metrics and logging"),
    ("router/tracing.py", None, "metrics and logging"),
    ("/logging/", None, "metrics and logging"),
    ("router/anthropic/", None, "anthropic translation"),  # /v1/messages only
    ("router/completions.py", None, "dispatch (app, completions, proxying)"),
    ("router/app.py", None, "dispatch (app, completions, proxying)"),
    ("router/proxying.py", None, "dispatch (app, completions, proxying)"),
)
LOOP = "event loop (epoll, socket reads, tasks)"
ORDER = ("accept and parse", "auth and key lookup", "limits and admission", "pick", "upstream connect and reuse",
         "write upstream", "read upstream", "shape", "relay", "write to client", "metering and signals",
         "metrics and logging", "anthropic translation", "dispatch (app, completions, proxying)", LOOP)


def stage_of(frames: list[str]) -> str:
    """The stage of one sample, its frames root first (py-spy's raw format: ``func (file:line)``)."""
    for frame in reversed(frames):
        func, _, where = frame.rpartition(" (")
        path = where.rsplit(":", 1)[0]
        name = func.rsplit(".", 1)[-1]
        for suffix, funcs, stage in STAGES:
            if suffix in path and (funcs is None or name in funcs):
                return stage
    return LOOP


def stages(raw: Path) -> dict[str, float]:
    """Each stage's share of the samples in py-spy's raw output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[stage_of(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    return {stage: counts[stage] / total for stage in ORDER}


def wrk_script(workdir: Path, stream: bool) -> Path:
    return router_capacity.lua(workdir, "", stream=stream)


def run_case(argv: list[str], env: dict[str, str], url: str, script: Path, args: argparse.Namespace,
             workdir: Path, name: str, *, profile: bool) -> dict[str, float]:
    """Start the process, load it with wrk, and return its CPU µs per request (and stage shares)."""
    proc = Proc.start([*router_peers.pin(0), *argv], env=env, log_path=workdir / f"{name}.log")
    try:
        proc.wait_http(url + "/v1/models", timeout=60, expect=lambda s, b: True)
        router_capacity.wrk(url, script, seconds=args.warmup, connections=args.connections, threads=args.threads)
        before = router_capacity.cpu_seconds(proc.pid)
        spy = None
        raw = workdir / f"{name}.raw"
        if profile:
            spy = subprocess.Popen([args.py_spy, "record", "-p", str(proc.pid), "-d", str(int(args.seconds)),
                                    "-r", "250", "-f", "raw", "-o", str(raw), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = router_capacity.wrk(url, script, seconds=args.seconds, connections=args.connections,
                                   threads=args.threads)
        spent = router_capacity.cpu_seconds(proc.pid) - before
        if spy is not None:
            spy.wait(timeout=args.seconds + 30)
        result = {"us": 1e6 * spent / done["requests"] if done["requests"] else 0.0, "rps": done["rps"],
                  "bad": done["non2xx"] + done["socket_errors"] + done["incomplete"]}
        if profile and raw.exists():
            result.update(stages(raw))
        return result
    finally:
        proc.stop()


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median CPU per request (its stage shares with it), failures summed over all."""
    ordered = sorted(runs, key=lambda r: r["us"])
    made = dict(ordered[len(ordered) // 2])
    made["bad"] = sum(r["bad"] for r in runs)
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", nargs="*", default=["vllm", "llamacpp"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case; figures are medians")
    parser.add_argument("--tree", metavar="TREE", help="measure the router from this checkout")
    parser.add_argument("--before", metavar="TREE", help="also measure the router from this checkout, interleaved")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk is not installed (`make bench-peers` installs it with apt-get as root)", file=sys.stderr)
        return 2
    if not Path(args.py_spy).exists():
        print(f"py-spy not found at {args.py_spy}: `.venv/bin/pip install py-spy` (make bench-costs does)",
              file=sys.stderr)
        return 2
    if router_peers.pin(1):
        os.sched_setaffinity(0, {1})
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-costs-"))
    python = sys.executable
    env = {**os.environ, "LLMGW_ROUTER_WORKERS": "1"}
    if args.tree:
        env["PYTHONPATH"] = str(Path(args.tree).resolve())
    before_env = {**env, "PYTHONPATH": str(Path(args.before).resolve())} if args.before else None
    figures: dict[str, dict[str, float]] = {}
    for engine in args.engine:
        up_port = free_port()
        up_url = f"http://127.0.0.1:{up_port}"
        upstream = Proc.start([*router_peers.pin(1), python, str(HERE / "fast_upstream.py"), "--port", str(up_port),
                               "--model", MODEL, "--order", "llamacpp" if engine == "llamacpp" else "openai"],
                              log_path=workdir / f"upstream-{engine}.log")
        try:
            upstream.wait_http(up_url + "/health", timeout=30)
            table = workdir / f"table-{engine}.json"
            table.write_text(json.dumps({"version": 1, "models": [{
                "name": MODEL, "served_name": MODEL, "state": "Ready", "routing": "round_robin", "engine": engine,
                "endpoints": [{"replica_id": "r-bench", "url": up_url}]}]}))
            for stream in (False, True):
                script = wrk_script(workdir, stream)
                what = f"{engine}, {'stream' if stream else 'whole'}"
                runs: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
                # Interleaved rounds: the machine's other load moves every contender alike.
                for i in range(args.rounds):
                    for name, one_env in (("llmgw", env), ("before", before_env), ("relay", None)):
                        if name == "before" and one_env is None:
                            continue
                        port = free_port()
                        url = f"http://127.0.0.1:{port}"
                        argv = ([python, str(HERE / "pure_relay.py"), "--port", str(port), "--upstream", up_url]
                                if name == "relay" else
                                [python, "-m", "llmgw.router.standalone", "--port", str(port), "--table-file",
                                 str(table), "--log-level", "warning"])
                        runs[name].append(run_case(argv, one_env or os.environ.copy(), url, script, args, workdir,
                                                   f"{name}-{engine}-{int(stream)}-{i}", profile=name == "llmgw"))
                ours = _median(runs["llmgw"])
                ours["relay_us"] = statistics.median(r["us"] for r in runs["relay"])
                if runs["before"]:
                    ours["before_us"] = statistics.median(r["us"] for r in runs["before"])
                figures[what] = ours
                print(f"{what}: llmgw {ours['us']:.1f} us/request ({ours['rps']:.0f}/s), pure relay "
                      f"{ours['relay_us']:.1f} us" + (f", before {ours['before_us']:.1f} us" if runs["before"] else ""),
                      flush=True)
        finally:
            upstream.stop()
    report(figures, args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print(f"logs and profiles in {workdir}")
    return 0


def report(figures: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    cases = list(figures)
    print(f"\nµs of the router's core per request, by stage (py-spy samples × CPU per request); wrk -t{args.threads} "
          f"-c{args.connections} -d{args.seconds:g}s, router on core 0, upstream and wrk on core 1")
    print(f"{'stage':42}" + "".join(f"{c:>20}" for c in cases))
    for stage in ORDER:
        print(f"{stage:42}" + "".join(f"{figures[c].get(stage, 0) * figures[c]['us']:20.1f}" for c in cases))
    print(f"{'total (CPU per request)':42}" + "".join(f"{figures[c]['us']:20.1f}" for c in cases))
    print(f"{'pure relay (CPU per request)':42}" + "".join(f"{figures[c]['relay_us']:20.1f}" for c in cases))
    if any("before_us" in figures[c] for c in cases):
        print(f"{'before (CPU per request)':42}" + "".join(f"{figures[c].get('before_us', 0):20.1f}" for c in cases))
        print(f"{'x before':42}" + "".join(
            f"{figures[c]['us'] / figures[c]['before_us'] if figures[c].get('before_us') else 0:20.2f}"
            for c in cases))
    print(f"{'x pure relay':42}" + "".join(
        f"{figures[c]['us'] / figures[c]['relay_us'] if figures[c]['relay_us'] else 0:20.2f}" for c in cases))
    bad = {c: figures[c]["bad"] for c in cases if figures[c].get("bad")}
    if bad:
        print(f"failed or incomplete answers: {bad}")


if __name__ == "__main__":
    sys.exit(main())
