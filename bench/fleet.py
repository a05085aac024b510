"""One control plane against a simulated fleet: heartbeat handling, CPU and memory as N grows; apply and restart.

    .venv/bin/python bench/fleet.py                          # 1000, 2500, 5000, 10000 nodes, then the replicas run
    .venv/bin/python bench/fleet.py --sizes 10000 --replicas 0 --profile 20

Every run starts its own ``llmgw server`` (a fresh data directory in a temp
dir, free ports) and its own ``llmgw sim fleet`` as separate processes, the
server pinned to one core and the fleet to another (``taskset -c``; ``--no-pin``
to leave it to the kernel), and ends both by pid, even on failure.

For each fleet size N, at ``--heartbeat`` seconds (5):

* **all registered**: from starting the fleet to the server's
  ``llmgw_nodes_connected`` reaching N.
* Then one heartbeat period to settle, then a steady window of ``--window``
  seconds, bounded by two scrapes of ``/metrics`` and two reads of
  ``/proc/PID/stat``; nothing else talks to the server in it. Over that window:
* **handling p50/p99**: ``llmgw_heartbeat_handling_seconds``, from the agent
  stream yielding a heartbeat to the service to the cluster having applied it
  (protobuf to core types, then ``Cluster.node_heartbeat``).
* **loop wait p50/p99/p99.9**: ``llmgw_event_loop_wait_seconds``, how long a
  message reaching the server at a random moment waits for its event loop
  before the stream can yield it (gRPC core receives on its own thread; the
  bytes wait for Python's loop). Measured by a probe sleeping 5 ms on the
  loop, weighted by time: every millisecond of wall clock counts as one
  arrival, so a one-second stall counts a thousand times, as the two thousand
  heartbeats that arrive in it would (``llmgw.control.agentsvc.metrics``).
  **heartbeat p99** (the figure held to < 100 ms) is p99(wait) + p99(handling),
  an upper bound on the p99 of their sum: the delay of a heartbeat from
  reaching the server to being applied. There is no send time on the wire
  and heartbeats are not acknowledged, so the network itself is not in it;
  on loopback that part is microseconds. ``lag_max_ms`` in the JSON is the
  worst single stall, to a bucket; ``gc`` the collections and their pauses.
* Quantiles are read from histogram bucket deltas, interpolated linearly within
  a bucket as Prometheus' ``histogram_quantile`` does; a quantile in the last
  finite bucket's overflow is shown as ">X".
* **hb/s**: heartbeats the server received per second (N/5 expected), and
  **fleet late p99**: how late the fleet sent its beats against their schedule;
  when the fleet cannot keep up, this grows and hb/s falls short of N/5.
* **CPU %** of one core, from utime+stime over the window; **RSS** (MiB) at its
  end, for the server and the fleet.

Then, unless ``--replicas 0``: ``--replica-nodes`` (1000) nodes, apply sim
models with ``--replicas`` (2000) replicas in all (1000 a model, the spec's
limit) and time until all are Ready; then
SIGTERM the server, start it again on the same data directory and ports, and
time (from the new process's start) until every node has re-registered with
its shard list and the models show every replica Ready, then wait
``--settle`` seconds and count the StartShard/StopShard/Drain commands the
fleet received since the restart (must be 0: no engine would be reloaded).

``--profile S`` records the server with py-spy for S seconds during the window
of the largest size (flame graph SVG in the output folder). ``--gc-both`` runs
each size twice: with the server's GC policy (``llmgw.control.agentsvc.collector``)
and with ``LLMGW_GC_FREEZE=0`` (Python's defaults), back to back. Results go to
``bench/results/fleet-<time>.json`` (gitignored) and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmgw.testing.procs import Proc, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
LLMGW = [sys.executable, "-m", "llmgw"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 2**20
MAX_REPLICAS = 1000


# -- processes -------------------------------------------------------------------------------
def _pinned(argv: list[str], core: int | None) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if core is not None else argv


class Server:
    def __init__(self, root: Path, *, core: int | None, node_grace_s: float, gc_freeze: bool = True) -> None:
        self.root, self.core, self.node_grace_s = root, core, node_grace_s
        self.env = {**os.environ, "LLMGW_GC_FREEZE": "1" if gc_freeze else "0"}
        self.http_port, self.agent_port = free_port(), free_port()
        self.proc: Proc | None = None
        self.starts = 0

    def start(self) -> float:
        """Starts it; returns the monotonic time the process was spawned."""
        self.starts += 1
        ports = self.root / "ports.json"
        ports.unlink(missing_ok=True)
        t0 = time.monotonic()
        self.proc = Proc.start(_pinned([*LLMGW, "server", "--http-port", str(self.http_port), "--agent-port",
                                        str(self.agent_port), "--data-dir", str(self.root / "data"),
                                        "--ports-file", str(ports), "--node-grace", str(self.node_grace_s),
                                        # simulated agents dial plaintext: loopback development mode
                                        "--insecure"],
                                       self.core), env=self.env, log_path=self.root / f"server-{self.starts}.log")
        wait_for(ports.exists, timeout=60, what="server ports file")
        self.proc.wait_http(f"{self.url}/healthz", timeout=60)
        return t0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=15)
            self.proc = None


class Fleet:
    def __init__(self, root: Path, *, server: Server, nodes: int, heartbeat_s: float, mix: str,
                 core: int | None) -> None:
        self.stats_path = root / f"fleet-{nodes}.json"
        self.stats_path.unlink(missing_ok=True)
        self.proc = Proc.start(_pinned([*LLMGW, "sim", "fleet", "--server", f"127.0.0.1:{server.agent_port}",
                                        "--nodes", str(nodes), "--mix", mix, "--heartbeat", str(heartbeat_s),
                                        "--stats-file", str(self.stats_path)], core),
                               log_path=root / f"fleet-{nodes}.log")

    def stats(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.stats_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def stop(self) -> None:
        self.proc.stop(timeout=20)


# -- measuring ---------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (fields 14 and 15 of /proc/PID/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def scrape(client: httpx.Client) -> dict[str, Any]:
    """Histograms as {name: [(le, cumulative count)]}, other samples as {name{labels}: value}."""
    text = client.get("/metrics").text
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                out.setdefault(s.name[: -len("_bucket")], []).append((float(s.labels["le"]), s.value))
            else:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def quantile(q: float, before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """The ``q`` quantile of the observations between two scrapes of one histogram (inf: above the last bucket)."""
    prev = dict(before)
    buckets = sorted((le, count - prev.get(le, 0.0)) for le, count in after)
    total = buckets[-1][1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if math.isinf(le):
                return float("inf")
            return lower + (le - lower) * ((rank - below) / (cum - below) if cum > below else 1.0)
        lower, below = le, cum
    return float("inf")


def top_bucket(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """The upper bound of the highest bucket that got an observation in the window (the max, to a bucket)."""
    prev = dict(before)
    buckets = sorted((le, count - prev.get(le, 0.0)) for le, count in after)
    top, last = 0.0, 0.0
    for le, cum in buckets:
        if cum > last:
            top = le
        last = cum
    return top


def connected(client: httpx.Client) -> int:
    return int(scrape(client).get("llmgw_nodes_connected", 0))


@contextlib.contextmanager
def client_for(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as c:
        yield c


# -- the runs ----------------------------------------------------------------------------------
def steady(n: int, ns: argparse.Namespace, work: Path, *, profile_s: int, gc_freeze: bool) -> dict[str, Any]:
    root = work / f"n{n}-{'freeze' if gc_freeze else 'default'}"
    root.mkdir()
    server = Server(root, core=ns.server_core, node_grace_s=30.0, gc_freeze=gc_freeze)
    fleet = None
    row: dict[str, Any] = {"nodes": n, "gc_freeze": gc_freeze}
    try:
        server.start()
        assert server.proc is not None
        with client_for(server) as c:
            t0 = time.monotonic()
            fleet = Fleet(root, server=server, nodes=n, heartbeat_s=ns.heartbeat, mix=ns.mix, core=ns.fleet_core)
            deadline = t0 + ns.register_timeout
            got = 0
            while time.monotonic() < deadline:
                got = connected(c)
                if got >= n or fleet.proc.poll() is not None:
                    break
                time.sleep(0.5)
            row["registered"] = got
            if got < n:
                row["all_registered_s"] = None
                row["stopped"] = (f"{got}/{n} registered after {ns.register_timeout:.0f}s"
                                  if fleet.proc.poll() is None else f"the fleet exited: {fleet.proc.log_tail(5)}")
                return row
            row["all_registered_s"] = round(time.monotonic() - t0, 2)
            time.sleep(ns.heartbeat)  # every node beating, the registration burst over
            spy = None
            if profile_s:
                svg = ns.out_dir / f"fleet-profile-{n}.svg"
                spy = subprocess.Popen([str(ROOT / ".venv/bin/py-spy"), "record", "--pid", str(server.proc.pid),
                                        "--duration", str(profile_s), "--rate", "50", "--nonblocking",
                                        "--output", str(svg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                row["profile"] = str(svg)
            m0, t_a = scrape(c), time.monotonic()
            s_cpu0, f_cpu0, f0 = proc_cpu_s(server.proc.pid), proc_cpu_s(fleet.proc.pid), fleet.stats()
            time.sleep(ns.window)
            s_cpu1, f_cpu1, f1 = proc_cpu_s(server.proc.pid), proc_cpu_s(fleet.proc.pid), fleet.stats()
            t_b, m1 = time.monotonic(), scrape(c)
            if spy is not None:
                spy.wait(timeout=profile_s + 60)
            span = t_b - t_a
            hb, lag, wait = ("llmgw_heartbeat_handling_seconds", "llmgw_event_loop_lag_seconds",
                             "llmgw_event_loop_wait_seconds")
            beats = m1.get("llmgw_agent_messages_total{kind=heartbeat}", 0) - m0.get(
                "llmgw_agent_messages_total{kind=heartbeat}", 0)
            row.update({
                "window_s": round(span, 1),
                "hb_per_s": round(beats / span, 1), "hb_expected_per_s": round(n / ns.heartbeat, 1),
                "handling_p50_ms": quantile(0.5, m0[hb], m1[hb]) * 1e3,
                "handling_p99_ms": quantile(0.99, m0[hb], m1[hb]) * 1e3,
                "wait_p50_ms": quantile(0.5, m0[wait], m1[wait]) * 1e3,
                "wait_p99_ms": quantile(0.99, m0[wait], m1[wait]) * 1e3,
                "wait_p999_ms": quantile(0.999, m0[wait], m1[wait]) * 1e3,
                "lag_p99_ms": quantile(0.99, m0[lag], m1[lag]) * 1e3,
                "lag_max_ms": top_bucket(m0[lag], m1[lag]) * 1e3,
                "gc": {g: {"count": m1.get(f"llmgw_gc_pause_seconds_count{{generation={g}}}", 0)
                           - m0.get(f"llmgw_gc_pause_seconds_count{{generation={g}}}", 0),
                           "seconds": round(m1.get(f"llmgw_gc_pause_seconds_sum{{generation={g}}}", 0)
                                            - m0.get(f"llmgw_gc_pause_seconds_sum{{generation={g}}}", 0), 3)}
                       for g in "012"},
                "gc_cpu_s": round(sum(m1.get(f"llmgw_gc_cpu_seconds_total{{generation={g}}}", 0)
                                      - m0.get(f"llmgw_gc_cpu_seconds_total{{generation={g}}}", 0) for g in "012"), 3),
                "server_cpu_pct": round(100 * (s_cpu1 - s_cpu0) / span, 1),
                "server_rss_mib": round(proc_rss(server.proc.pid)[0] / MIB),
                "server_hwm_mib": round(proc_rss(server.proc.pid)[1] / MIB),
                "fleet_cpu_pct": round(100 * (f_cpu1 - f_cpu0) / span, 1),
                "fleet_rss_mib": round(proc_rss(fleet.proc.pid)[0] / MIB),
                "fleet_late_p99_ms": _late_p99(f0, f1) * 1e3,
                "fleet_reconnects": f1.get("sessions", 0) - f0.get("sessions", 0),
                "load_avg": os.getloadavg()[0],
            })
            row["heartbeat_p99_ms"] = row["wait_p99_ms"] + row["handling_p99_ms"]
            return row
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()


def _late_p99(f0: dict[str, Any], f1: dict[str, Any]) -> float:
    if not f1.get("late") or not f0.get("late"):
        return float("nan")
    bounds = [*f1["late_buckets"], float("inf")]
    before = list(zip(bounds, _cumsum(f0["late"]), strict=True))
    after = list(zip(bounds, _cumsum(f1["late"]), strict=True))
    return quantile(0.99, before, after)


def _cumsum(xs: list[int]) -> list[float]:
    out, total = [], 0.0
    for x in xs:
        total += x
        out.append(total)
    return out


def replicas_and_restart(ns: argparse.Namespace, work: Path) -> dict[str, Any]:
    n, want = ns.replica_nodes, ns.replicas
    root = work / "replicas"
    root.mkdir()
    server = Server(root, core=ns.server_core, node_grace_s=30.0)
    fleet = None
    row: dict[str, Any] = {"nodes": n, "replicas": want}
    # A model may ask for at most 1000 replicas, so the total is split over as few models as that allows.
    per_model = [min(MAX_REPLICAS, want - i) for i in range(0, want, MAX_REPLICAS)]
    models = [{"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": f"fleet-{i}"},
               "spec": {"engine": "sim", "served_name": f"fleet-{i}", "replicas": k}} for i, k in enumerate(per_model)]
    row["models"] = len(models)

    def ready(c: httpx.Client) -> int:
        return sum(int(m["status"]["ready_replicas"]) for m in c.get("/api/v1/models").json()["items"])

    try:
        server.start()
        with client_for(server) as c:
            fleet = Fleet(root, server=server, nodes=n, heartbeat_s=ns.heartbeat, mix=ns.mix, core=ns.fleet_core)
            wait_for(lambda: connected(c) >= n, timeout=ns.register_timeout, interval=0.5, what=f"{n} registered")
            t0 = time.monotonic()
            for model in models:
                resp = c.post("/api/v1/models", json=model)
                assert resp.status_code in (200, 201), resp.text
            wait_for(lambda: ready(c) >= want, timeout=300, interval=0.25, what=f"{want} replicas Ready")
            row["apply_to_ready_s"] = round(time.monotonic() - t0, 2)
        time.sleep(2)
        before = fleet.stats()
        server.stop()
        t0 = server.start()
        row["restart_listening_s"] = round(time.monotonic() - t0, 2)
        with client_for(server) as c:
            wait_for(lambda: connected(c) >= n, timeout=120, interval=0.25, what=f"{n} re-registered")
            row["restart_registered_s"] = round(time.monotonic() - t0, 2)
            wait_for(lambda: ready(c) >= want, timeout=120, interval=0.25, what=f"{want} Ready again")
            row["restart_ready_s"] = round(time.monotonic() - t0, 2)
            time.sleep(ns.settle)
            after = fleet.stats()
            row["ready_after_settle"] = ready(c)
        row["commands_after_restart"] = {k: after.get(k, 0) - before.get(k, 0) for k in ("starts", "stops", "drains")}
        row["settle_s"] = ns.settle
        return row
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()


def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return ">10 000"
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| nodes | gc freeze | all registered (s) | hb/s (expected) | handling p50 / p99 (ms) "
            "| loop wait p50 / p99 / p99.9 (ms) "
            "| heartbeat p99 (ms) | server CPU % | server RSS (MiB) | fleet CPU % | fleet RSS (MiB) "
            "| fleet late p99 (ms) | load avg |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if r.get("all_registered_s") is None:
            lines.append(f"| {r['nodes']} | {r['gc_freeze']} | stopped: {r.get('stopped')} | | | | | | | | | | |")
            continue
        lines.append(
            f"| {r['nodes']} | {'yes' if r['gc_freeze'] else 'no'} | {r['all_registered_s']} "
            f"| {r['hb_per_s']:.0f} ({r['hb_expected_per_s']:.0f}) "
            f"| {_ms(r['handling_p50_ms'])} / {_ms(r['handling_p99_ms'])} "
            f"| {_ms(r['wait_p50_ms'])} / {_ms(r['wait_p99_ms'])} / {_ms(r['wait_p999_ms'])} "
            f"| {_ms(r['heartbeat_p99_ms'])} | {r['server_cpu_pct']} | {r['server_rss_mib']} "
            f"| {r['fleet_cpu_pct']} | {r['fleet_rss_mib']} | {_ms(r['fleet_late_p99_ms'])} | {r['load_avg']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2500,5000,10000", help="fleet sizes, comma-separated")
    ap.add_argument("--heartbeat", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=30.0, help="seconds of steady state measured per size")
    ap.add_argument("--mix", default="h100:0.3,l40s:0.3,cpu:0.4")
    ap.add_argument("--register-timeout", type=float, default=240.0)
    ap.add_argument("--replica-nodes", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=2000, help="0 skips the apply/restart run")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after Ready again to count commands")
    ap.add_argument("--profile", type=int, default=0, help="py-spy seconds during the largest size's window")
    ap.add_argument("--gc-both", action="store_true",
                    help="run each size twice: with the server's gc freezing, then with LLMGW_GC_FREEZE=0")
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--fleet-core", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true", help="do not pin the server and the fleet to cores")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    if ns.no_pin or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        ns.server_core = ns.fleet_core = None
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in ns.sizes.split(",") if x.strip()]
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "cpus": os.cpu_count(), "pinned": ns.server_core is not None,
                              "heartbeat_s": ns.heartbeat, "window_s": ns.window, "steady": []}
    out = ns.out_dir / f"fleet-{time.strftime('%Y%m%dT%H%M%S')}.json"
    # SIGTERM (a timeout around this script) must still run the finally blocks that stop the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="llmgw-fleet-bench-") as tmp:
        work = Path(tmp)
        for n in sizes:
            for gc_freeze in ((True, False) if ns.gc_both else (True,)):
                row = steady(n, ns, work, profile_s=ns.profile if n == max(sizes) and gc_freeze else 0,
                             gc_freeze=gc_freeze)
                report["steady"].append(row)
                print(json.dumps(row), flush=True)
                out.write_text(json.dumps(report, indent=1))
        if ns.replicas:
            report["replicas"] = replicas_and_restart(ns, work)
            print(json.dumps(report["replicas"]), flush=True)
            out.write_text(json.dumps(report, indent=1))
    print()
    print(table(report["steady"]))
    if "replicas" in report:
        r = report["replicas"]
        print(f"\n{r['nodes']} nodes: {r['replicas']} replicas ({r['models']} models) Ready "
              f"{r['apply_to_ready_s']} s after apply; "
              f"after a server restart: listening {r['restart_listening_s']} s, all re-registered "
              f"{r['restart_registered_s']} s, all Ready {r['restart_ready_s']} s; commands in the "
              f"{r['settle_s']:.0f} s after: {r['commands_after_restart']}")
    print(f"\nraw: {out}")


if __name__ == "__main__":
    main()
