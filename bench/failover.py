"""Failover of the control plane: kill -9 the leader, time until the standby leads, holds the agents and routes.

    .venv/bin/python bench/failover.py                       # 5 default + 5 fast runs, then 1,000 simulated agents
    .venv/bin/python bench/failover.py --runs 1 --fleet-runs 0

Everything runs against one real PostgreSQL the script starts (``llmgw.testing.postgres``: initdb in a temporary
directory, a free port on 127.0.0.1), a fresh database for each run; every process is started by the script and
ended by its pid, even on failure.

**Real agents** (``--runs`` times with the default lease, ``--lease 6s --lease-renew 1s``, and as many with the fast
one, ``--lease 2s --lease-renew 0.25s``): control planes A and B (``llmgw.testing.system.System``: mutual TLS, B
initialised with A's CA), A started first so it leads; two real agents joined through A, running sim engines for a
sim model of 2 replicas; completions back to back through B's in-process router from two clients, one
streaming (``llmgw.testing.load.Load``: a stream counts only when it ends with ``[DONE]``). Then ``kill -9``
of A, and from that moment, polling B every ``--poll`` seconds (0.05):

* **leader**: B's ``GET /api/v1/controlplanes`` names B as the leader.
* **agents**: both nodes connected on B's ``GET /api/v1/nodes`` (forwarded to the leader on a standby, so this
  answers only once B leads and holds them).
* **ready**: from then, both replicas in the router's table: B's ``GET /api/v1/endpoints`` (with a router's
  credential, as ``llmgw router`` reads it) lists 2 endpoints for the model. **min Ready** is the fewest
  endpoints that document listed at any poll from the kill to the end (2: a router never lost a replica).
* **failed**: requests that failed, of those sent from 1 s before the kill to 1 s after ready (the goal: 0);
  **engines**: whether the engine processes (the agents' children) are the same pids after as before;
  **replicas**: whether the replica ids are the same and Ready.

**Simulated agents** (``--fleet-runs``, 1): A and B with ``--insecure`` (the simulator dials plaintext) and the
default lease; ``llmgw sim fleet --nodes N --server A,B`` (N = ``--nodes``, 1,000) with ``--stats-file``; a sim
model of ``--replicas`` (1,000) replicas placed on them, all Ready; ``kill -9`` of A; **registered** is the time
until the fleet's stats file counts all N registered again (with B: A is dead), **ready** until B's models show
every replica Ready; then ``--settle`` seconds (10) and the StartShard/StopShard/Drain commands the fleet received
since the kill (the goal: 0, no engine would be restarted).

Results: a Markdown table per part, printed, and ``bench/results/failover-<time>.json`` (gitignored); the logs of a
run that went wrong (a step not reached, a request failed, an engine restarted, a command sent) are copied to
``bench/results/failover-logs-<time>/<run>/``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llmgw.testing.load import Load
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System, sim_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("--lease", "6s", "--lease-renew", "1s")
FAST = ("--lease", "2s", "--lease-renew", "0.25s")
# Agents and routers are sent to the advertised addresses: loopback here, whatever this machine's FQDN resolves to.
ADVERTISE = ("--advertise-address", "127.0.0.1")
_names = itertools.count(1)


def _json(client: httpx.Client, path: str, token: str) -> Any:
    """The document at ``path``, or None when it does not answer 200 (a standby with no leader answers 503)."""
    try:
        resp = client.get(path, headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


def _leads(doc: Any) -> bool:
    """Whether the controlplanes document says its own instance is the leader."""
    if not doc:
        return False
    me = doc.get("self")
    return any(cp.get("role") == "leader" and (cp.get("id") or cp.get("name")) == me for cp in doc["controlplanes"])


def _roles(doc: Any) -> list[str]:
    return sorted(cp.get("role", "") for cp in doc["controlplanes"]) if doc else []


def _endpoints(doc: Any, model: str) -> int | None:
    if not doc:
        return None
    return next((len(m["endpoints"]) for m in doc.get("models", []) if m["name"] == model), 0)


def _connected(doc: Any, nodes: tuple[str, ...]) -> bool:
    if not doc:
        return False
    items = {n["id"]: n for n in doc["items"]}
    return all(items.get(n, {}).get("connected") for n in nodes)


# -- real agents --------------------------------------------------------------------------------------------------
def agents_run(pg: Postgres, work: Path, *, settings: str, lease: tuple[str, ...], poll_s: float,
               timeout_s: float, keep: Path, keep_all: bool = False) -> dict[str, Any]:
    """One failover with real agents; the logs are kept under ``keep`` when it went wrong."""
    name = f"fo{next(_names)}"
    root = work / name
    url = pg.create_database(name)
    args = (*lease, *ADVERTISE)
    a = System(root / "a", database=url, server_args=args)
    b = System(root / "b", database=url, ca_from=root / "a" / "data" / "pki", server_args=args)
    row: dict[str, Any] = {"settings": settings, "run": name}
    nodes = ("node1", "node2")
    try:
        a.start_server()
        b.token = a.token
        b.start_server()
        # Agents learn the standbys from the leader's answer to their Register, and only then: one registered
        # before A had read B's row never hears of B and is lost with A (seen: B then replaced its replica).
        wait_for(lambda: _roles(a.get("/api/v1/controlplanes")) == ["leader", "standby"], timeout=30,
                 what="A leads and lists B")
        for node in nodes:
            a.start_agent(node)
        a.apply(sim_model("m", replicas=2))
        a.wait_model("m", timeout=90)
        b.wait_router("m", 2, timeout=30)
        made = a.request("POST", "/api/v1/routers", json={"name": "bench"})
        assert made.status_code in (200, 201), made.text
        router_token = str(made.json()["token"])
        engines = a.engine_pids("node1") | a.engine_pids("node2")
        replicas = sorted(r["id"] for r in a.replicas("m"))
        with httpx.Client(base_url=b.url, timeout=5, trust_env=False) as c, Load(b.url, "m", clients=2) as load:
            time.sleep(1.0)
            assert a.server is not None
            t_kill = time.monotonic()
            a.server.signal(signal.SIGKILL)
            t0 = time.monotonic()
            t_leader = t_agents = t_ready = None
            min_ready: int | None = None
            polls = 0
            while time.monotonic() - t0 < timeout_s:
                polls += 1
                n_ready = _endpoints(_json(c, "/api/v1/endpoints", router_token), "m")
                now = time.monotonic() - t0
                if n_ready is not None:
                    min_ready = n_ready if min_ready is None else min(min_ready, n_ready)
                if t_leader is None and _leads(_json(c, "/api/v1/controlplanes", b.token)):
                    t_leader = now
                if t_leader is not None and t_agents is None and _connected(_json(c, "/api/v1/nodes", b.token),
                                                                            nodes):
                    t_agents = time.monotonic() - t0
                if t_agents is not None and n_ready == 2:
                    t_ready = time.monotonic() - t0
                    break
                time.sleep(poll_s)
            a.server.stop(timeout=5)  # reaps it and closes its log
            a.server = None
            time.sleep(1.0)
            t_end = time.monotonic()
        row.update({
            "t_leader_s": _round(t_leader), "t_agents_s": _round(t_agents), "t_ready_s": _round(t_ready),
            "min_ready": min_ready, "polls": polls, "ok": load.ok,
            "failed": len(load.failures), "load_s": round(t_end - t_kill + 1.0, 1),
            "failures": load.failures[:10],
            "engines_unchanged": a.engine_pids("node1") | a.engine_pids("node2") == engines,
            "replicas_unchanged": sorted(r["id"] for r in b.replicas("m")) == replicas
            and all(r["phase"] == "Ready" for r in b.replicas("m")),
        })
        if t_ready is None:
            tail = b.server.log_tail(8) if b.server else ""
            row["stopped"] = f"not every step within {timeout_s:.0f}s; B's log: {tail}"
        return row
    finally:
        b.close()
        a.close()
        if keep_all or "stopped" in row or row.get("failed") or not row.get("engines_unchanged", True) \
                or row.get("min_ready") != 2:
            row["logs"] = _keep_logs(root, keep / name)


def _keep_logs(root: Path, dest: Path) -> str:
    """Copies every log under ``root`` (servers, agents, engines, the fleet) to ``dest``; returns where."""
    for log in root.rglob("*.log"):
        to = dest / log.relative_to(root)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, to)
    return str(dest)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# -- simulated agents ---------------------------------------------------------------------------------------------
def fleet_run(pg: Postgres, work: Path, ns: argparse.Namespace) -> dict[str, Any]:
    name = f"fleet{next(_names)}"
    root = work / name
    url = pg.create_database(name)
    args = (*DEFAULT, *ADVERTISE, "--node-grace", "30")
    a = System(root / "a", database=url, server_args=args, secure=False)
    b = System(root / "b", database=url, server_args=args, secure=False)
    n, want = ns.nodes, ns.replicas
    row: dict[str, Any] = {"nodes": n, "replicas": want, "settings": "default", "run": name}
    stats_path = root / "fleet.json"
    fleet: Proc | None = None

    def stats() -> dict[str, Any]:
        try:
            return dict(json.loads(stats_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def ready(s: System) -> int:
        try:
            return sum(int(m["status"]["ready_replicas"]) for m in s.get("/api/v1/models")["items"])
        except httpx.HTTPError:
            return -1

    def connected(s: System) -> int:
        return sum(1 for node in s.get("/api/v1/nodes")["items"] if node["connected"])

    try:
        a.start_server()
        b.start_server()
        wait_for(lambda: _leads(a.get("/api/v1/controlplanes")), timeout=30, what="A leads")
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--nodes", str(n), "--heartbeat", "5",
                            "--server", f"127.0.0.1:{a.agent_port},127.0.0.1:{b.agent_port}",
                            "--stats-file", str(stats_path)], log_path=root / "fleet.log")
        t0 = time.monotonic()
        wait_for(lambda: connected(a) >= n, timeout=180, interval=0.5, what=f"{n} registered with A")
        row["registered_s"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        a.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "fleet"},
                 "spec": {"engine": "sim", "served_name": "fleet", "replicas": want}})
        wait_for(lambda: ready(a) >= want, timeout=300, interval=0.5, what=f"{want} replicas Ready")
        row["apply_to_ready_s"] = round(time.monotonic() - t0, 2)
        time.sleep(2.0)
        before = stats()
        assert a.server is not None
        a.server.signal(signal.SIGKILL)
        t0 = time.monotonic()
        t_leader = t_registered = t_ready = None
        with httpx.Client(base_url=b.url, timeout=5, trust_env=False) as c:
            while time.monotonic() - t0 < ns.fleet_timeout:
                now = time.monotonic() - t0
                if t_leader is None and _leads(_json(c, "/api/v1/controlplanes", "")):
                    t_leader = now
                # Registered again: N new sessions since the kill (the stats file is written every 0.5 s, so
                # ``registered`` alone still says N for a moment after A died) and N registered now.
                got = stats()
                if t_registered is None and got.get("registered", 0) >= n \
                        and got.get("sessions", 0) - before.get("sessions", 0) >= n:
                    t_registered = time.monotonic() - t0
                if t_registered is not None and ready(b) >= want:
                    t_ready = time.monotonic() - t0
                    break
                time.sleep(0.1)
        a.server.stop(timeout=5)
        a.server = None
        row.update({"t_leader_s": _round(t_leader), "t_registered_s": _round(t_registered),
                    "t_ready_s": _round(t_ready)})
        if t_ready is None:
            row["stopped"] = (f"fleet registered {stats().get('registered')}/{n}, ready {ready(b)}/{want} after "
                              f"{ns.fleet_timeout:.0f}s")
        time.sleep(ns.settle)
        after = stats()
        row["commands_after_kill"] = {k: after.get(k, 0) - before.get(k, 0) for k in ("starts", "stops", "drains")}
        row["redirects"] = after.get("redirects", 0) - before.get("redirects", 0)
        row["ready_after_settle"] = ready(b)
        row["settle_s"] = ns.settle
        return row
    finally:
        if fleet is not None:
            fleet.stop(timeout=20)
        b.close()
        a.close()
        if "stopped" in row or any(row.get("commands_after_kill", {}).values()):
            row["logs"] = _keep_logs(root, ns.keep / name)


# -- report -------------------------------------------------------------------------------------------------------
def _fmt(x: Any) -> str:
    return "—" if x is None else str(x)


def agents_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| settings | run | leader (s) | agents (s) | ready (s) | min Ready | requests ok | failed "
             "| engines unchanged | replicas unchanged |", "|---|---|---|---|---|---|---|---|---|---|"]
    for settings in ("default", "fast"):
        mine = [r for r in rows if r["settings"] == settings]
        for i, r in enumerate(mine, 1):
            lines.append(f"| {settings} | {i} | {_fmt(r.get('t_leader_s'))} | {_fmt(r.get('t_agents_s'))} "
                         f"| {_fmt(r.get('t_ready_s'))} | {_fmt(r.get('min_ready'))} | {_fmt(r.get('ok'))} "
                         f"| {_fmt(r.get('failed'))} | {_fmt(r.get('engines_unchanged'))} "
                         f"| {_fmt(r.get('replicas_unchanged'))} |")
        for label, fn in (("median", statistics.median), ("max", max)):
            cols = []
            for key in ("t_leader_s", "t_agents_s", "t_ready_s"):
                xs = [r[key] for r in mine if r.get(key) is not None]
                cols.append(f"{fn(xs):.2f}" if xs and len(xs) == len(mine) else "—")
            if mine:
                lines.append(f"| {settings} | **{label}** | {' | '.join(cols)} | | | | | |")
    return "\n".join(lines)


def fleet_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| nodes | replicas | registered with A (s) | apply to Ready (s) | leader (s) | all re-registered (s) "
             "| all Ready on B (s) | start / stop / drain after the kill | redirects followed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cmd = r.get("commands_after_kill", {})
        lines.append(f"| {r['nodes']} | {r['replicas']} | {_fmt(r.get('registered_s'))} "
                     f"| {_fmt(r.get('apply_to_ready_s'))} | {_fmt(r.get('t_leader_s'))} "
                     f"| {_fmt(r.get('t_registered_s'))} | {_fmt(r.get('t_ready_s'))} "
                     f"| {cmd.get('starts', '—')} / {cmd.get('stops', '—')} / {cmd.get('drains', '—')} "
                     f"| {_fmt(r.get('redirects'))} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="real-agent runs with each of the default and fast settings")
    ap.add_argument("--only", choices=("default", "fast"), default=None, help="real-agent runs with one setting only")
    ap.add_argument("--fleet-runs", type=int, default=1, help="runs with simulated agents (0: none)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=1000, help="of one sim model on the simulated fleet (<= 1000)")
    ap.add_argument("--poll", type=float, default=0.05, help="seconds between polls of B after the kill")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a real-agent failover may take")
    ap.add_argument("--fleet-timeout", type=float, default=120.0, help="seconds a simulated failover may take")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after Ready to count commands")
    ap.add_argument("--keep-logs", action="store_true", help="keep every real-agent run's logs, not only those "
                    "of runs that went wrong")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime('%Y%m%dT%H%M%S')
    out = ns.out_dir / f"failover-{stamp}.json"
    # The logs of a run that went wrong (a step not reached, a request failed, an engine restarted).
    ns.keep = ns.out_dir / f"failover-logs-{stamp}"
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()[0],
                              "agents": [], "fleet": []}
    # SIGTERM (a timeout around this script) must still run the finally blocks that stop the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = [(s, lease) for s, lease in (("default", DEFAULT), ("fast", FAST)) if ns.only in (None, s)]
    with tempfile.TemporaryDirectory(prefix="llmgw-failover-bench-") as tmp, Postgres() as pg:
        work = Path(tmp)
        for name, lease in settings:
            for _ in range(ns.runs):
                try:
                    row = agents_run(pg, work, settings=name, lease=lease, poll_s=ns.poll, timeout_s=ns.timeout,
                                     keep=ns.keep, keep_all=ns.keep_logs)
                except Exception as e:  # noqa: BLE001 (a failed run is a finding; the next runs still go)
                    row = {"settings": name, "stopped": f"{type(e).__name__}: {e}"[:1000]}
                report["agents"].append(row)
                print(json.dumps(row), flush=True)
                out.write_text(json.dumps(report, indent=1))
        for _ in range(ns.fleet_runs):
            try:
                row = fleet_run(pg, work, ns)
            except Exception as e:  # noqa: BLE001
                row = {"nodes": ns.nodes, "replicas": ns.replicas, "stopped": f"{type(e).__name__}: {e}"[:1000]}
            report["fleet"].append(row)
            print(json.dumps(row), flush=True)
            out.write_text(json.dumps(report, indent=1))
    report["load_avg_end"] = os.getloadavg()[0]
    out.write_text(json.dumps(report, indent=1))
    print()
    if report["agents"]:
        print(agents_table(report["agents"]))
    if report["fleet"]:
        print()
        print(fleet_table(report["fleet"]))
    print(f"\nraw: {out}")


if __name__ == "__main__":
    main()
