"""The control plane under REST load: heartbeat delay of N simulated agents and the in-process router's added TTFT.

    .venv/bin/python bench/control_load.py                      # 10,000 agents, this checkout
    .venv/bin/python bench/control_load.py --quick              # 2,000 agents, shorter windows
    git worktree add /tmp/before HEAD~1 && .venv/bin/python bench/control_load.py --before /tmp/before

One ``llmgw server`` (run from ``--tree``: its ``PYTHONPATH``, so a worktree of an
older commit is measured with this script) pinned to core 0 (``taskset``); on
core 1 the simulated fleet, ``bench/fast_upstream.py``, the REST client and this
script's TTFT client. Every process is ended by pid, even on failure.

The fleet is ``llmgw.sim.fleet`` (real gRPC streams, fake GPUs, shards Ready
without an engine) run by this script (``--role fleet``), so that the shards of
one model, ``bench-ttft``, report ``fast_upstream``'s address as their endpoint:
the in-process router then serves that model from a near-zero-cost upstream,
and what its TTFT adds over a direct request is the server's own time.

After all N agents registered and ``bench-ttft`` answers through ``/v1``, two
windows, each between two scrapes of ``/metrics``:

* **idle** (``--idle-window`` s): the fleet beats and the TTFT client runs;
  nothing else talks to the server.
* **load** (``--window`` s): a REST client (``--role loader``, its own process)
  applies ``--models`` sim models (``--replicas-per-model`` each) one after the
  other, then until the window ends pages ``GET /api/v1/events`` (500 a page,
  following ``after`` to the end, then from the start again) and ``GET
  /api/v1/replicas`` in turn: back to back (a faster server is given more to
  do), or ``--rest-rate`` pairs a second (the same work for every server).

In each window:

* **heartbeat p99** = p99 of ``llmgw_event_loop_wait_seconds`` (how long a
  message arriving at a random moment waits for the server's event loop; time
  weighted, see ``llmgw.control.agentsvc.metrics``) + p99 of
  ``llmgw_heartbeat_handling_seconds``, as ``bench/fleet.py`` defines it;
  **lag max** is the longest single stall of the loop, to a bucket.
* **TTFT**: streamed chat completions to ``bench-ttft`` at ``--ttft-rate`` pairs
  a second, each pair one direct to the upstream and one through the server's
  ``/v1`` in alternating order (as ``bench/router_overhead.py``); TTFT is the
  time to the first body byte. **added** = routed quantile - direct quantile.
* The loader's own view: latency of each REST call kind, how long the 100
  applies took, and how many of the applied replicas were Ready at the end.
* **GC pause**: seconds the collector stopped every thread in the window, by
  generation (``llmgw_gc_pause_seconds``), and how many full (gen 2) collections.

Results: ``bench/results/control-load-<label>-<time>.json`` and a Markdown row
per window on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TTFT_MODEL = "bench-ttft"
LOAD_PREFIX = "bench-load-"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the fleet (--role fleet) ------------------------------------------------------------------
def fleet_main(ns: argparse.Namespace) -> None:
    """The simulated fleet, with bench-ttft's shards pointing at the fast upstream."""
    import dataclasses
    import logging

    from llmgw.core.shards import ShardState, ShardStatus
    from llmgw.sim import fleet as fleet_mod

    logging.basicConfig(level=logging.WARNING)
    original = fleet_mod.FakeAgent._status

    def status(self: Any, spec: Any, state: ShardState, message: str = "") -> ShardStatus:
        st = original(self, spec, state, message)
        if spec.replica_id.startswith(TTFT_MODEL + "-"):
            st = dataclasses.replace(st, endpoint=ns.upstream)
            self.shards[spec.shard_id] = st
        return st

    fleet_mod.FakeAgent._status = status  # type: ignore[method-assign]

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stats = fleet_mod.Stats()
        agents = fleet_mod.build_fleet(ns.nodes, fleet_mod.parse_mix(ns.mix), heartbeat_s=ns.heartbeat, stats=stats)
        await fleet_mod.run(ns.server, agents, stop=stop, stats_file=Path(ns.stats_file))
        os._exit(0)  # as `llmgw sim fleet`: grpc.aio can hang in asyncio.run's final cancellation

    asyncio.run(main())


# -- the REST client (--role loader) -----------------------------------------------------------
def loader_main(ns: argparse.Namespace) -> None:
    """Applies the models, then pages events and lists replicas until the deadline; writes its stats."""
    import httpx

    deadline = time.monotonic() + ns.seconds
    lat: dict[str, list[float]] = {"apply": [], "events": [], "replicas": []}
    out: dict[str, Any] = {}
    with httpx.Client(base_url=ns.url, timeout=60, trust_env=False) as c:

        def timed(kind: str, method: str, path: str, **kw: Any) -> httpx.Response:
            t0 = time.perf_counter()
            resp = c.request(method, path, **kw)
            lat[kind].append(time.perf_counter() - t0)
            if resp.status_code >= 300:
                raise RuntimeError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
            return resp

        t0 = time.monotonic()
        for i in range(ns.models):
            timed("apply", "POST", "/api/v1/models", json={
                "apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": f"{LOAD_PREFIX}{i:03d}"},
                "spec": {"engine": "sim", "served_name": f"{LOAD_PREFIX}{i:03d}",
                         "replicas": ns.replicas_per_model}})
        out["apply_all_s"] = round(time.monotonic() - t0, 3)
        after, pages, events_seen, lists = 0, 0, 0, 0
        while time.monotonic() < deadline:
            nxt = time.monotonic() + (1.0 / ns.rest_rate if ns.rest_rate > 0 else 0.0)
            items = timed("events", "GET", "/api/v1/events", params={"after": after, "limit": 500}).json()["items"]
            pages += 1
            events_seen += len(items)
            after = items[-1]["id"] if len(items) == 500 else 0
            timed("replicas", "GET", "/api/v1/replicas")
            lists += 1
            time.sleep(max(0.0, nxt - time.monotonic()))
        models = c.get("/api/v1/models").json()["items"]
        mine = [m for m in models if m["metadata"]["name"].startswith(LOAD_PREFIX)]
        out["ready_at_end"] = sum(int(m["status"]["ready_replicas"]) for m in mine)
        out["wanted"] = ns.models * ns.replicas_per_model
    out.update({"event_pages": pages, "events_read": events_seen, "replica_lists": lists})
    for kind, xs in lat.items():
        out[f"{kind}_n"] = len(xs)
        out[f"{kind}_p50_ms"] = round(_pct(xs, 0.5) * 1e3, 2)
        out[f"{kind}_p99_ms"] = round(_pct(xs, 0.99) * 1e3, 2)
        out[f"{kind}_max_ms"] = round(max(xs, default=float("nan")) * 1e3, 2)
    Path(ns.stats_file).write_text(json.dumps(out))


# -- the orchestrator --------------------------------------------------------------------------
async def _ttft_client(direct: str, routed: str, *, seconds: float, rate: float) -> dict[str, list[float]]:
    """Pairs of streamed requests (direct, routed; the order alternating) for ``seconds``; TTFTs in seconds."""
    import aiohttp

    body = json.dumps({"model": TTFT_MODEL, "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Say something short."}]}).encode()
    headers = {"Content-Type": "application/json"}
    out: dict[str, list[float]] = {"direct": [], "routed": [], "errors": []}

    async def one(session: aiohttp.ClientSession, base: str) -> float | None:
        start = time.perf_counter()
        async with session.post(base + "/v1/chat/completions", data=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            ttft = 0.0
            async for chunk in resp.content.iter_any():
                if not ttft and chunk:
                    ttft = time.perf_counter() - start
            return ttft

    deadline = time.monotonic() + seconds
    i = 0
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            nxt = time.monotonic() + 1.0 / rate
            order = [("direct", direct), ("routed", routed)]
            if i % 2:
                order.reverse()
            for name, base in order:
                t = await one(session, base)
                if t is None:
                    out["errors"].append(time.monotonic())
                else:
                    out[name].append(t)
            i += 1
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
    return out


def _window_row(label: str, window: str, m0: dict[str, Any], m1: dict[str, Any], span: float,
                ttft: dict[str, list[float]], cpu_s: float, n: int) -> dict[str, Any]:
    from fleet import quantile, top_bucket  # bench/fleet.py: the same histogram arithmetic

    hb, wait, lag = ("llmgw_heartbeat_handling_seconds", "llmgw_event_loop_wait_seconds",
                     "llmgw_event_loop_lag_seconds")
    beats = m1.get("llmgw_agent_messages_total{kind=heartbeat}", 0) - m0.get(
        "llmgw_agent_messages_total{kind=heartbeat}", 0)
    row: dict[str, Any] = {
        "label": label, "window": window, "nodes": n, "window_s": round(span, 1),
        "hb_per_s": round(beats / span, 1),
        "handling_p99_ms": quantile(0.99, m0[hb], m1[hb]) * 1e3,
        "wait_p50_ms": quantile(0.5, m0[wait], m1[wait]) * 1e3,
        "wait_p99_ms": quantile(0.99, m0[wait], m1[wait]) * 1e3,
        "wait_p999_ms": quantile(0.999, m0[wait], m1[wait]) * 1e3,
        "lag_max_ms": top_bucket(m0[lag], m1[lag]) * 1e3,
        "server_cpu_pct": round(100 * cpu_s / span, 1), "load_avg": os.getloadavg()[0],
        "ttft_n": len(ttft["routed"]), "ttft_errors": len(ttft["errors"]),
        "gc": {g: {"count": m1.get(f"llmgw_gc_pause_seconds_count{{generation={g}}}", 0)
                   - m0.get(f"llmgw_gc_pause_seconds_count{{generation={g}}}", 0),
                   "seconds": round(m1.get(f"llmgw_gc_pause_seconds_sum{{generation={g}}}", 0)
                                    - m0.get(f"llmgw_gc_pause_seconds_sum{{generation={g}}}", 0), 3)}
               for g in "012"},
    }
    row["heartbeat_p99_ms"] = row["wait_p99_ms"] + row["handling_p99_ms"]
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        d, r = _pct(ttft["direct"], q) * 1e3, _pct(ttft["routed"], q) * 1e3
        row[f"ttft_direct_{name}_ms"], row[f"ttft_routed_{name}_ms"] = d, r
        row[f"ttft_added_{name}_ms"] = r - d
    return row


def orchestrate(ns: argparse.Namespace) -> list[dict[str, Any]]:
    """One run on ``ns.tree``; its window rows."""
    import httpx

    sys.path.insert(0, str(ROOT / "bench"))
    from fleet import proc_cpu_s, scrape

    from llmgw.testing.procs import Proc, free_port, wait_for

    tree = Path(ns.tree).resolve()
    label = ns.label or tree.name
    pin = not ns.no_pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2

    def pinned(argv: list[str], core: int) -> list[str]:
        return ["taskset", "-c", str(core), *argv] if pin else argv

    if pin:
        os.sched_setaffinity(0, {1})  # this script's TTFT client shares core 1 with the fleet
    env = {**os.environ, "PYTHONPATH": str(tree)}
    work = Path(tempfile.mkdtemp(prefix="llmgw-control-load-"))
    http_port, agent_port, up_port = free_port(), free_port(), free_port()
    url, upstream = f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{up_port}"
    procs: list[Proc] = []
    report: dict[str, Any] = {"label": label, "tree": str(tree), "nodes": ns.nodes, "pinned": pin,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "windows": []}
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    out_path = ns.out_dir / f"control-load-{label}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    me = [sys.executable, str(Path(__file__).resolve())]
    try:
        procs.append(Proc.start(pinned([sys.executable, str(ROOT / "bench" / "fast_upstream.py"), "--port",
                                        str(up_port), "--model", TTFT_MODEL], 1), log_path=work / "upstream.log"))
        server = Proc.start(pinned([sys.executable, "-m", "llmgw", "server", "--http-port", str(http_port),
                                    "--agent-port", str(agent_port), "--data-dir", str(work / "data"),
                                    "--insecure"], 0),  # simulated agents dial plaintext
                            env=env, log_path=work / "server.log")
        procs.append(server)
        server.wait_http(url + "/healthz", timeout=60)
        procs[0].wait_http(upstream + "/health", timeout=30)
        t0 = time.monotonic()
        fleet = Proc.start(pinned([*me, "--role", "fleet", "--server", f"127.0.0.1:{agent_port}",
                                        "--nodes", str(ns.nodes), "--upstream", upstream, "--stats-file",
                                        str(work / "fleet.json")], 1), env=env, log_path=work / "fleet.log")
        procs.append(fleet)

        def registered(c: httpx.Client) -> bool:
            if fleet.poll() is not None:
                raise RuntimeError(f"the fleet exited: {fleet.log_tail(10)}")
            return int(scrape(c).get("llmgw_nodes_connected", 0)) >= ns.nodes

        with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
            wait_for(lambda: registered(c),
                     timeout=ns.register_timeout, interval=1.0, what=f"{ns.nodes} agents registered")
            report["all_registered_s"] = round(time.monotonic() - t0, 1)
            print(f"[{label}] {ns.nodes} registered in {report['all_registered_s']} s", flush=True)
            c.post("/api/v1/models", json={"apiVersion": "llmgw/v1", "kind": "Model",
                                           "metadata": {"name": TTFT_MODEL},
                                           "spec": {"engine": "sim", "served_name": TTFT_MODEL, "replicas": 1}})

            def routed_ok() -> bool:
                r = c.post("/v1/chat/completions", json={"model": TTFT_MODEL, "max_tokens": 1,
                                                         "messages": [{"role": "user", "content": "hi"}]})
                return r.status_code == 200

            wait_for(routed_ok, timeout=120, interval=0.5, what=f"{TTFT_MODEL} served through /v1")
            time.sleep(ns.settle)
            windows = [("idle", ns.idle_window)] if ns.idle_window > 0 else []
            windows.append(("load", ns.window))
            for window, seconds in windows:
                loader = None
                m0, ta, cpu0 = scrape(c), time.monotonic(), proc_cpu_s(server.pid)
                if window == "load":
                    loader = Proc.start(pinned([*me, "--role", "loader", "--url", url, "--seconds", str(seconds),
                                                "--models", str(ns.models), "--rest-rate", str(ns.rest_rate),
                                                "--replicas-per-model",
                                                str(ns.replicas_per_model), "--stats-file",
                                                str(work / "loader.json")], 1), env=env,
                                        log_path=work / "loader.log")
                    procs.append(loader)
                spy = None
                if ns.profile and window == "load":
                    # --gil: only samples where a thread holds the GIL, i.e. what keeps the loop waiting.
                    py_spy = shutil.which("py-spy") or str(ROOT / ".venv/bin/py-spy")
                    spy = subprocess.Popen([py_spy, "record", "--pid", str(server.pid),
                                            "--duration", str(int(seconds)), "--rate", "100", "--gil",
                                            "--threads", "--nonblocking", "--format", "raw", "--output",
                                            str(ns.out_dir / f"control-load-{label}.txt")],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                ttft = asyncio.run(_ttft_client(upstream, url, seconds=seconds, rate=ns.ttft_rate))
                if spy is not None:
                    spy.wait(timeout=60)
                cpu1, tb, m1 = proc_cpu_s(server.pid), time.monotonic(), scrape(c)
                row = _window_row(label, window, m0, m1, tb - ta, ttft, cpu1 - cpu0, ns.nodes)
                if loader is not None:
                    if loader.popen.wait(timeout=120) != 0:
                        raise RuntimeError(f"the REST client failed: {loader.log_tail(20)}")
                    row["rest"] = json.loads((work / "loader.json").read_text())
                report["windows"].append(row)
                print(json.dumps(row), flush=True)
                out_path.write_text(json.dumps(report, indent=1))
    finally:
        for proc in reversed(procs):
            proc.stop(timeout=20)
    print()
    print(table(report["windows"]))
    print(f"\nraw: {out_path}", flush=True)
    return list(report["windows"])


def _ms(x: float) -> str:
    if math.isnan(x):
        return "—"
    if math.isinf(x):
        return ">10 000"
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| code | window | nodes | hb/s | loop wait p99 / p99.9 (ms) | lag max (ms) | heartbeat p99 (ms) "
             "| TTFT direct p50 / p99 (ms) | TTFT via server p50 / p99 (ms) | added p50 / p99 (ms) "
             "| REST p50 / p99 (ms): events, replicas, apply | Ready at end "
             "| GC pause (s): gen 0 / 1 / 2, (gen 2 count) | server CPU % | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rest = r.get("rest")
        rest_s = (f"{_ms(rest['events_p50_ms'])} / {_ms(rest['events_p99_ms'])}, "
                  f"{_ms(rest['replicas_p50_ms'])} / {_ms(rest['replicas_p99_ms'])}, "
                  f"{_ms(rest['apply_p50_ms'])} / {_ms(rest['apply_p99_ms'])}") if rest else "—"
        ready = f"{rest['ready_at_end']}/{rest['wanted']}" if rest else "—"
        gc_s = " / ".join(f"{r['gc'][g]['seconds']:.2f}" for g in "012") + f" ({r['gc']['2']['count']:.0f})"
        lines.append(
            f"| {r['label']} | {r['window']} | {r['nodes']} | {r['hb_per_s']:.0f} "
            f"| {_ms(r['wait_p99_ms'])} / {_ms(r['wait_p999_ms'])} | {_ms(r['lag_max_ms'])} "
            f"| {_ms(r['heartbeat_p99_ms'])} "
            f"| {_ms(r['ttft_direct_p50_ms'])} / {_ms(r['ttft_direct_p99_ms'])} "
            f"| {_ms(r['ttft_routed_p50_ms'])} / {_ms(r['ttft_routed_p99_ms'])} "
            f"| {_ms(r['ttft_added_p50_ms'])} / {_ms(r['ttft_added_p99_ms'])} | {rest_s} | {ready} | {gc_s} "
            f"| {r['server_cpu_pct']} | {r['load_avg']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=str(ROOT), help="checkout whose llmgw the server (and fleet) run")
    ap.add_argument("--before", default="", help="a checkout to run first (labelled before); then --tree (after)")
    ap.add_argument("--label", default="", help="name of this run in the table (default: the tree's folder)")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="2,000 agents, 20 s windows")
    ap.add_argument("--heartbeat", type=float, default=5.0)
    ap.add_argument("--mix", default="h100:0.3,l40s:0.3,cpu:0.4")
    ap.add_argument("--models", type=int, default=100, help="models the REST client applies")
    ap.add_argument("--replicas-per-model", type=int, default=1)
    ap.add_argument("--rest-rate", type=float, default=0.0,
                    help="events pages + replica lists a second (0: back to back, as fast as the server answers)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of the load window")
    ap.add_argument("--idle-window", type=float, default=20.0, help="seconds of the idle window (0: none)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between bench-ttft answering and the windows")
    ap.add_argument("--ttft-rate", type=float, default=50.0, help="direct+routed pairs a second")
    ap.add_argument("--register-timeout", type=float, default=300.0)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy (GIL holders, by thread) on the server over the load window, into --out-dir")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    # The roles this script plays in its child processes.
    ap.add_argument("--role", choices=("main", "fleet", "loader"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--stats-file", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.role == "fleet":
        fleet_main(ns)
        return 0
    if ns.role == "loader":
        loader_main(ns)
        return 0
    if ns.quick:
        ns.nodes = 2000 if ns.nodes == 10_000 else ns.nodes
        ns.window, ns.idle_window = min(ns.window, 20.0), min(ns.idle_window, 10.0)
    # SIGTERM (a timeout around this script) must still run the finally that stops the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not ns.before:
        orchestrate(ns)
        return 0
    rows: list[dict[str, Any]] = []
    for tree, label in ((ns.before, "before"), (ns.tree, "after")):
        rows += orchestrate(argparse.Namespace(**{**vars(ns), "tree": tree, "label": label}))
    print("\nbefore, then after, back to back:\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
