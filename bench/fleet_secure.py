"""A simulated fleet with real identities: N nodes join, hold mutual TLS streams, take an apply, survive a failover.

    .venv/bin/python bench/fleet_secure.py --nodes 10000                   # both parts
    .venv/bin/python bench/fleet_secure.py --nodes 2000 --parts steady

What ``bench/fleet.py`` measures with ``--insecure`` (plaintext, 100 streams on a connection), measured
here as a cluster runs: ``llmgw init`` (a CA), ``llmgw server`` with its join port and the agent port on
mutual TLS, one join token with N uses, and ``llmgw sim fleet --token --ca-hash --join`` in which every node
makes its own key, joins through the join port (a CSR, signed by the control plane) and dials the agent
port on its own TLS connection with its own certificate. Every process is started here and ended by pid.

**steady** (one server, SQLite, ``llmgw.testing.system.System``):

* **joined**: the fleet's own count: from its first join to all N certificates (``join_s`` in its stats).
* **all connected (cold)**: from starting the fleet process (no key, no certificate) to the server's
  ``llmgw_nodes_connected`` = N: every node joined, dialled, registered (the goal: < 60 s).
* Then one heartbeat period to settle and a window of ``--window`` seconds between two ``/metrics``
  scrapes, as ``bench/fleet.py`` (its docstring defines the columns): **heartbeat p99** = p99(loop wait)
  + p99(handling), **lag p99 / max** of the server's event loop, server and fleet CPU and RSS.
* **apply**: one sim model of ``--replicas`` replicas; time to all Ready, and the same heartbeat and lag
  figures over the window from the apply to Ready.

**failover** (two servers A and B on one PostgreSQL the script starts, B with A's CA, default lease): the
fleet joins through A's join port and dials ``A,B``; the model of ``--replicas`` replicas Ready; ``kill -9``
of A; then **leader** (B names itself), **all back** (N new sessions in the fleet's stats, all with B), **all
Ready on B** (its models' ready replicas; the goal: < 30 s), and after ``--settle`` seconds the
StartShard/StopShard/Drain commands the fleet received since the kill (the goal: 0).

Results: ``bench/results/fleet-secure-<time>.json`` (gitignored), and the rows printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fleet as fleet_bench  # bench/fleet.py: the metrics scraping and quantiles
import httpx

from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System

ROOT = Path(__file__).resolve().parent.parent
ADVERTISE = ("--advertise-address", "127.0.0.1")


def _stats(paths: list[Path]) -> dict[str, Any]:
    """The fleet processes' counts, summed (``join_s`` the slowest's, ``last_error`` any one's)."""
    out: dict[str, Any] = {}
    for path in paths:
        try:
            doc = dict(json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        for key in ("registered", "sessions", "starts", "stops", "drains", "errors", "joined", "redirects",
                    "renewed", "heartbeats"):
            out[key] = out.get(key, 0) + doc.get(key, 0)
        out["join_s"] = max(out.get("join_s", 0.0), doc.get("join_s", 0.0))
        out["last_error"] = doc.get("last_error") or out.get("last_error", "")
    return out


class Fleets:
    """``procs`` fleet processes of ``n / procs`` nodes each (prefixes f0, f1, ...), one token for them all.

    Several because one Python process holding some 3,000 gRPC TLS channels stalled here: registrations
    stopped with connections open and both processes idle, a gRPC thread of the fleet blocked in a
    socket send (measured at 2,903 of 10,000 and 3,314 of 5,000 nodes in one process).
    """

    def __init__(self, root: Path, system: System, n: int, *, procs: int, servers: str = "", heartbeat_s: float,
                 dial_in_flight: int = 0) -> None:
        token = system.join_token(uses=n, ttl_s=3600)
        self.procs: list[Proc] = []
        self.paths: list[Path] = []
        for k in range(procs):
            share = n // procs + (1 if k < n % procs else 0)
            path = root / f"fleet-{k}.json"
            argv = [*LLMGW, "sim", "fleet", "--join", f"127.0.0.1:{system.join_port}", "--token", token,
                    "--ca-hash", system.ca_hash, "--nodes", str(share), "--prefix", f"f{k}", "--heartbeat",
                    str(heartbeat_s), "--stats-file", str(path), "--seed", str(k)]
            if servers:
                argv += ["--server", servers]
            if dial_in_flight:
                argv += ["--dial-in-flight", str(dial_in_flight)]
            self.procs.append(Proc.start(argv, log_path=root / f"fleet-{k}.log"))
            self.paths.append(path)

    def stats(self) -> dict[str, Any]:
        return _stats(self.paths)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def cpu_s(self) -> float:
        return sum(fleet_bench.proc_cpu_s(p.pid) for p in self.procs)

    def rss_mib(self) -> int:
        return round(sum(fleet_bench.proc_rss(p.pid)[0] for p in self.procs) / fleet_bench.MIB)

    def stop(self) -> None:
        for p in self.procs:
            p.signal(signal.SIGTERM)
        for p in self.procs:
            p.stop(timeout=30)


def _scrape(system: System) -> dict[str, Any]:
    with httpx.Client(base_url=system.url, timeout=60, trust_env=False,
                      headers={"Authorization": f"Bearer {system.token}"}) as c:
        return fleet_bench.scrape(c)


def _connected(system: System) -> int:
    try:
        return int(_scrape(system).get("llmgw_nodes_connected", 0))
    except httpx.HTTPError:
        return -1


def _ready(system: System) -> int:
    try:
        return sum(int(m["status"]["ready_replicas"]) for m in system.get("/api/v1/models")["items"])
    except (httpx.HTTPError, KeyError, AssertionError):
        return -1


def _window(m0: dict[str, Any], m1: dict[str, Any]) -> dict[str, float]:
    """Heartbeat and loop figures between two scrapes (ms)."""
    hb, lag, wait = ("llmgw_heartbeat_handling_seconds", "llmgw_event_loop_lag_seconds",
                     "llmgw_event_loop_wait_seconds")
    out = {"handling_p99_ms": fleet_bench.quantile(0.99, m0[hb], m1[hb]) * 1e3,
           "wait_p99_ms": fleet_bench.quantile(0.99, m0[wait], m1[wait]) * 1e3,
           "lag_p99_ms": fleet_bench.quantile(0.99, m0[lag], m1[lag]) * 1e3,
           "lag_max_ms": fleet_bench.top_bucket(m0[lag], m1[lag]) * 1e3}
    out["heartbeat_p99_ms"] = out["wait_p99_ms"] + out["handling_p99_ms"]
    return {k: round(v, 2) for k, v in out.items()}


def _model(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "fleet"},
            "spec": {"engine": "sim", "served_name": "fleet", "replicas": replicas}}


def steady(ns: argparse.Namespace, work: Path) -> dict[str, Any]:
    root = work / "steady"
    root.mkdir()
    system = System(root, server_args=("--node-grace", "30", *ADVERTISE))
    n = ns.nodes
    row: dict[str, Any] = {"part": "steady", "nodes": n, "fleet_procs": ns.procs, "dial_in_flight": ns.dial_in_flight}
    fleet = None
    try:
        system.start_server()
        assert system.server is not None
        t0 = time.monotonic()
        fleet = Fleets(root, system, n, procs=ns.procs, heartbeat_s=ns.heartbeat, dial_in_flight=ns.dial_in_flight)
        got = 0
        while time.monotonic() - t0 < ns.timeout and fleet.alive():
            got = _connected(system)
            if got >= n:
                break
            time.sleep(0.5)
        row["connected"] = got
        if got < n:
            row["stopped"] = (f"{got}/{n} connected after {time.monotonic() - t0:.0f}s; fleet: "
                              f"{fleet.stats().get('last_error')}")
            return row
        row["cold_to_all_connected_s"] = round(time.monotonic() - t0, 2)
        wait_for(lambda: fleet.stats().get("joined") == n, timeout=10, what="the fleet's stats")
        row["join_s"] = fleet.stats()["join_s"]
        time.sleep(ns.heartbeat)
        m0, s0, f0 = _scrape(system), fleet_bench.proc_cpu_s(system.server.pid), fleet.cpu_s()
        time.sleep(ns.window)
        m1, s1, f1 = _scrape(system), fleet_bench.proc_cpu_s(system.server.pid), fleet.cpu_s()
        beats = m1.get("llmgw_agent_messages_total{kind=heartbeat}", 0) - m0.get(
            "llmgw_agent_messages_total{kind=heartbeat}", 0)
        row["idle"] = {**_window(m0, m1), "hb_per_s": round(beats / ns.window, 1),
                       "server_cpu_pct": round(100 * (s1 - s0) / ns.window, 1),
                       "fleet_cpu_pct": round(100 * (f1 - f0) / ns.window, 1),
                       "server_rss_mib": round(fleet_bench.proc_rss(system.server.pid)[0] / fleet_bench.MIB),
                       "fleet_rss_mib": fleet.rss_mib(),
                       "load_avg": os.getloadavg()[0]}
        print(json.dumps(row), flush=True)
        if ns.replicas:
            m0, t0 = _scrape(system), time.monotonic()
            system.apply(_model(ns.replicas))
            wait_for(lambda: _ready(system) >= ns.replicas, timeout=ns.timeout, interval=0.5,
                     what=f"{ns.replicas} replicas Ready")
            span = time.monotonic() - t0
            m1 = _scrape(system)
            row["apply"] = {"replicas": ns.replicas, "apply_to_ready_s": round(span, 2), **_window(m0, m1),
                            "load_avg": os.getloadavg()[0]}
        row["fleet_errors"] = fleet.stats().get("errors")
        return row
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()


def failover(ns: argparse.Namespace, work: Path, pg: Postgres) -> dict[str, Any]:
    root = work / "failover"
    url = pg.create_database("fleetsecure")
    args = ("--lease", "6s", "--lease-renew", "1s", *ADVERTISE, "--node-grace", "30")
    a = System(root / "a", database=url, server_args=args)
    b = System(root / "b", database=url, ca_from=root / "a" / "data" / "pki", server_args=args)
    n, want = ns.nodes, ns.replicas
    row: dict[str, Any] = {"part": "failover", "nodes": n, "replicas": want, "fleet_procs": ns.procs,
                           "dial_in_flight": ns.dial_in_flight}
    fleet = None
    try:
        a.start_server()
        b.token = a.token
        b.start_server()
        wait_for(lambda: sorted(cp.get("role", "") for cp in a.get("/api/v1/controlplanes")["controlplanes"])
                 == ["leader", "standby"], timeout=30, what="A leads and lists B")
        t0 = time.monotonic()
        fleet = Fleets(root, a, n, procs=ns.procs, servers=f"127.0.0.1:{a.agent_port},127.0.0.1:{b.agent_port}",
                       heartbeat_s=ns.heartbeat, dial_in_flight=ns.dial_in_flight)
        wait_for(lambda: _connected(a) >= n, timeout=ns.timeout, interval=0.5, what=f"{n} connected to A")
        row["cold_to_all_connected_s"] = round(time.monotonic() - t0, 2)
        wait_for(lambda: fleet.stats().get("joined") == n, timeout=10, what="the fleet's stats")
        row["join_s"] = fleet.stats()["join_s"]
        t0 = time.monotonic()
        a.apply(_model(want))
        wait_for(lambda: _ready(a) >= want, timeout=ns.timeout, interval=0.5, what=f"{want} replicas Ready")
        row["apply_to_ready_s"] = round(time.monotonic() - t0, 2)
        time.sleep(2.0)
        before = fleet.stats()
        assert a.server is not None
        a.server.signal(signal.SIGKILL)
        t0 = time.monotonic()
        t_leader = t_back = t_ready = None
        with httpx.Client(base_url=b.url, timeout=5, trust_env=False,
                          headers={"Authorization": f"Bearer {b.token}"}) as c:
            while time.monotonic() - t0 < ns.timeout:
                if t_leader is None:
                    try:
                        doc = c.get("/api/v1/controlplanes").json()
                        if any(cp.get("role") == "leader" and (cp.get("id") or cp.get("name")) == doc.get("self")
                               for cp in doc.get("controlplanes", [])):
                            t_leader = time.monotonic() - t0
                    except (httpx.HTTPError, ValueError):
                        pass
                got = fleet.stats()
                if t_back is None and got.get("registered", 0) >= n \
                        and got.get("sessions", 0) - before.get("sessions", 0) >= n:
                    t_back = time.monotonic() - t0
                if t_back is not None and _ready(b) >= want:
                    t_ready = time.monotonic() - t0
                    break
                time.sleep(0.2)
        a.server.stop(timeout=5)
        a.server = None
        row.update({"leader_s": t_leader and round(t_leader, 2), "all_back_s": t_back and round(t_back, 2),
                    "all_ready_on_b_s": t_ready and round(t_ready, 2), "load_avg": os.getloadavg()[0]})
        if t_ready is None:
            got = fleet.stats()
            row["stopped"] = (f"fleet registered {got.get('registered')}/{n}, ready on B {_ready(b)}/{want} after "
                              f"{ns.timeout:.0f}s; last fleet error: {got.get('last_error')}")
        time.sleep(ns.settle)
        after = fleet.stats()
        row["commands_after_kill"] = {k: after.get(k, 0) - before.get(k, 0) for k in ("starts", "stops", "drains")}
        row["redirects"] = after.get("redirects", 0) - before.get("redirects", 0)
        row["fleet_last_error"] = after.get("last_error")
        return row
    finally:
        if fleet is not None:
            fleet.stop()
        b.close()
        a.close()
        if "stopped" in row or any(row.get("commands_after_kill", {}).values()):
            row["logs"] = _keep_logs(root, ns.out_dir / f"fleet-secure-logs-{time.strftime('%Y%m%dT%H%M%S')}")


def _keep_logs(root: Path, dest: Path) -> str:
    for log in root.rglob("*.log"):
        to = dest / log.relative_to(root)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, to)
    return str(dest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=1000, help="one sim model of this many (0: no apply)")
    ap.add_argument("--heartbeat", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=20.0, help="seconds of steady state measured")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds any one step may take")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after Ready again to count commands")
    ap.add_argument("--parts", default="steady,failover")
    ap.add_argument("--procs", type=int, default=0, help="fleet processes [default: one per 1,000 nodes]")
    ap.add_argument("--dial-in-flight", type=int, default=0,
                    help="the fleet's --dial-in-flight (0: every node dials when ready, as real agents)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    ns.procs = ns.procs or max(1, -(-ns.nodes // 1000))
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    parts = {p.strip() for p in ns.parts.split(",")}
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                              "nofile": __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE),
                              "rows": []}
    out = ns.out_dir / f"fleet-secure-{time.strftime('%Y%m%dT%H%M%S')}.json"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="llmgw-fleet-secure-") as tmp:
        work = Path(tmp)
        if "steady" in parts:
            report["rows"].append(steady(ns, work))
            print(json.dumps(report["rows"][-1]), flush=True)
            out.write_text(json.dumps(report, indent=1))
        if "failover" in parts:
            with Postgres() as pg:
                report["rows"].append(failover(ns, work, pg))
            print(json.dumps(report["rows"][-1]), flush=True)
            out.write_text(json.dumps(report, indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
