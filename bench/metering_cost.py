"""What metering and cluster budgets cost the router (issue 26): capacity and added TTFT, on vs off, same run.

Two standalone routers over one ``fast_upstream.py`` (canned answers, so the router is what is measured),
the same table, the same key, started together and measured in interleaved rounds (``router_capacity``'s
wrk runs and CPU-second counts, ``router_peers``' TTFT at concurrency 1):

* **off**: ``python -m llmgw.router.standalone --table-file``: no quota or usage service, so nothing is
  metered and the key's budgets are not enforced (the per-router rpm/tpm window, empty here);
* **on**: this script as the router (``--serve``): the same app with the sim ledger (``llmgw.sim.ledger``)
  as its in-process quota and usage services and a usage journal on disk, so every request is metered
  (its usage found, its record numbered, written with ``os.write`` and sent in batches) and admitted
  out of leases on the key's requests_per_day and tokens_per_day and its project's tokens_per_month
  (limits high enough that nothing is refused), each answer carrying the x-ratelimit headers.

The transports are in-process calls, as inside ``llmgw server``; a standalone router's HTTP POSTs come once a
second (a sync, a batch), not per request. Figures: medians of the rounds, and on/off ratios.

``--inproc N``: the router's own CPU per request, without sockets: N non-streamed requests straight through
the app (its ASGI entry, a canned upstream answer), off / meter / on in turn, the best of five runs each;
steadier than wrk on a machine whose other load comes and goes, and it is what metering adds per request.

    .venv/bin/python bench/metering_cost.py [--rounds 3] [--seconds 4] [--latency 1000]
    .venv/bin/python bench/metering_cost.py --inproc 20000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import peers
import router_capacity
import router_peers

from llmgw.testing.procs import Proc, free_port

HERE = Path(__file__).resolve().parent
MODEL = router_peers.MODEL
SECRET = "sk-metering-bench"
HUGE = 10**12


def table(upstream: str) -> dict[str, object]:
    return {"version": 1,
            "models": [{"name": MODEL, "served_name": MODEL, "state": "Ready", "routing": "round_robin",
                        "pricing": {"input_per_1m": 1.0, "output_per_1m": 2.0},
                        "endpoints": [{"replica_id": "r-bench", "url": upstream, "node": "bench-node"}]}],
            "auth": {"required": True,
                     "keys": [{"id": "kbench", "sha256": hashlib.sha256(SECRET.encode()).hexdigest(),
                               "project": "bench", "limits": {"requests_per_day": HUGE, "tokens_per_day": HUGE}}],
                     "projects": [{"name": "bench", "limits": {"tokens_per_month": HUGE}}]}}


def serve(table_file: Path, port: int, journal_dir: Path, mode: str) -> int:
    """The "on" router (``mode`` "meter": metering only, no budgets): the standalone router's app and server,
    with the sim ledger as its control plane."""
    from llmgw.router import standalone
    from llmgw.router import table as table_mod
    from llmgw.router.settings import ProxySettings
    from llmgw.sim.ledger import SimLedger

    ledger = SimLedger({("key:kbench", "requests_per_day"): HUGE, ("key:kbench", "tokens_per_day"): HUGE,
                        ("project:bench", "tokens_per_month"): HUGE}, keep_records=False)
    holder = table_mod.TableHolder()
    holder.swap(table_mod.RouteTable.from_doc(json.loads(table_file.read_text())))
    proxy = ProxySettings()
    app = standalone.proxied(holder, proxy, source=str(table_file), serve_metrics=True,
                             quota=ledger.sync if mode == "on" else None,
                             usage=ledger.ingest, usage_journal_dir=journal_dir, router_id="bench")
    import uvloop

    return uvloop.run(standalone.serve(app, host="127.0.0.1", port=port, max_body_bytes=proxy.max_body_bytes,
                                       grace_s=1.0, source=str(table_file), http_limits=proxy.limits))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="each wrk figure's duration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--latency", type=int, default=1000, help="streamed requests for TTFT (0: skip)")
    parser.add_argument("--inproc", type=int, default=0, metavar="N",
                        help="measure the app's CPU per request in process, N requests a run, and stop")
    parser.add_argument("--serve", nargs=4, metavar=("TABLE", "PORT", "JOURNAL_DIR", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(Path(args.serve[0]), int(args.serve[1]), Path(args.serve[2]), args.serve[3])
    if args.inproc:
        return asyncio.run(inproc(args.inproc))
    if not shutil.which("wrk"):
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    if router_peers.pin(1):
        os.sched_setaffinity(0, {1})
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-metering-"))
    up_port = free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    py = peers.python_for_project()
    procs = [Proc.start([*router_peers.pin(1), py, str(HERE / "fast_upstream.py"), "--port", str(up_port),
                         "--model", MODEL], log_path=workdir / "upstream.log")]
    table_file = workdir / "table.json"
    table_file.write_text(json.dumps(table(upstream_url)))
    routers: dict[str, tuple[str, int]] = {}
    try:
        procs[0].wait_http(upstream_url + "/health", timeout=30)
        for name in ("off", "meter", "on"):
            port = free_port()
            argv = ([py, "-m", "llmgw.router.standalone", "--port", str(port), "--table-file", str(table_file),
                     "--log-level", "warning", "--workers", "1"] if name == "off" else
                    [py, str(HERE / "metering_cost.py"), "--serve", str(table_file), str(port),
                     str(workdir / f"journal-{name}"), name])
            proc = Proc.start([*router_peers.pin(0), *argv], log_path=workdir / f"{name}.log")
            procs.append(proc)
            url = f"http://127.0.0.1:{port}"
            proc.wait_http(url + "/metrics", timeout=60)
            routers[name] = (url, proc.pid)
        time.sleep(args.settle)
        measured: dict[str, list[dict[str, float]]] = {n: [] for n in routers}
        for i in range(args.rounds):
            for name, (url, pid) in routers.items():
                one = router_capacity.measure(url, SECRET, args, workdir, warm=i == 0, pid=pid)
                measured[name].append(one)
                print(f"round {i + 1} {name}: {one['rps']:.0f} req/s, {one['streams']:.0f} streams/s; per CPU-second "
                      f"{one['cpu_rps']:.0f} and {one['cpu_streams']:.0f}"
                      + (f" ({one['bad']:.0f} failed or incomplete)" if one["bad"] else ""), flush=True)
        rows = {name: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                for name, rounds in measured.items()}
        if args.latency:
            # Interleaved in halves, so a slower minute of the machine falls on both.
            ttft: dict[str, list[float]] = {n: [] for n in routers}
            for _ in range(2):
                for name, (url, _) in routers.items():
                    samples = asyncio.run(router_peers.latency(url, SECRET, n=args.latency // 2, warmup=50,
                                                               max_tokens=2))
                    ttft[name] += [t * 1000 for t, _ in samples]
            for name in routers:
                rows[name]["p50"] = router_peers.pct(ttft[name], 50)
                rows[name]["p99"] = router_peers.pct(ttft[name], 99)
        report(rows, args)
        print(f"logs in {workdir}")
    finally:
        for proc in reversed(procs):
            proc.stop()
    return 0


_ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": MODEL,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                   "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}).encode()


class _Canned:
    status = 200
    headers = {"Content-Type": "application/json"}

    async def read(self) -> bytes:
        return _ANSWER

    def close(self) -> None:
        pass


class CannedUpstream:
    """A forwarder answering every request with one whole chat completion, no socket (``--inproc``)."""

    async def open(self, route: object, path: str, body: bytes, **_: object) -> tuple[object, _Canned]:
        return route.endpoints[0], _Canned()  # type: ignore[attr-defined]


async def inproc(n: int) -> int:
    """The app's CPU per request (process time), off / meter / on, each the best of five runs of ``n``."""
    import tempfile as tmp

    from llmgw.router import app as app_mod
    from llmgw.router import table as table_mod
    from llmgw.router.asgi import CANCELS
    from llmgw.sim.ledger import SimLedger

    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST",
             "headers": [(b"authorization", b"Bearer " + SECRET.encode())], "extensions": {CANCELS: {}}}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        pass

    results: dict[str, list[float]] = {"off": [], "meter": [], "on": []}
    for mode in ("off", "meter", "on") * 2:
        holder = table_mod.TableHolder()
        holder.swap(table_mod.RouteTable.from_doc(table("http://127.0.0.1:9")))
        parts: dict[str, object] = {}
        if mode != "off":
            ledger = SimLedger({("key:kbench", "requests_per_day"): HUGE, ("key:kbench", "tokens_per_day"): HUGE,
                                ("project:bench", "tokens_per_month"): HUGE}, keep_records=False)
            parts = {"usage": ledger.ingest, "usage_journal_dir": Path(tmp.mkdtemp(prefix="llmgw-journal-")),
                     "router_id": "bench", "quota": ledger.sync if mode == "on" else None}
        app = app_mod.RouterApp(holder, **parts)  # type: ignore[arg-type]
        app._proxy.forwarder = CannedUpstream()  # type: ignore[assignment]
        if app.journal is not None:
            await app.journal.start()
        for _ in range(2000):
            await app(dict(scope), receive, send)
        for _ in range(5):
            start = time.process_time()
            for i in range(n):
                await app(dict(scope), receive, send)
                if i % 256 == 0:
                    await asyncio.sleep(0)  # the journal's and the budgets' tasks run, as between requests
            results[mode].append((time.process_time() - start) / n * 1e6)
        if app.quota is not None:
            await app.quota.stop()
        if app.journal is not None:
            await app.journal.stop()
    best = {mode: min(v) for mode, v in results.items()}
    print(f"the app's CPU per non-streamed request, in process (best of {len(results['off'])} runs of {n}):")
    for mode in ("off", "meter", "on"):
        added = best[mode] - best["off"]
        print(f"  {mode:6} {best[mode]:6.2f} us" + (f"  (+{added:.2f} us)" if mode != "off" else ""))
    return 0


def report(rows: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    off = rows["off"]
    print(f"\nmedians of {args.rounds} rounds of wrk -t1 -c{args.connections} -d{args.seconds:g}s; router on core 0; "
          "meter: metering and the journal, no budgets; on: metering and budgets")
    for name in ("meter", "on"):
        on = rows[name]
        for k, label in (("rps", "req/s"), ("streams", "streams/s"), ("cpu_rps", "req per CPU-s"),
                         ("cpu_streams", "streams per CPU-s")):
            cost = (1 - on[k] / off[k]) * 100 if off[k] else 0.0
            print(f"{label:18} off {off[k]:9.0f}  {name:5} {on[k]:9.0f}  x off {on[k] / off[k] if off[k] else 0:5.3f}  "
                  f"cost {cost:5.1f} %")
        if "p50" in on:
            for p in ("p50", "p99"):
                label = f"TTFT {p} (ms)"
                print(f"{label:18} off {off[p]:9.3f}  {name:5} {on[p]:9.3f}  added {on[p] - off[p]:6.3f}")
        if on.get("bad"):
            print(f"({on['bad']:.0f} failed or incomplete)")


if __name__ == "__main__":
    sys.exit(main())
