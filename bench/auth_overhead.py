"""What security costs: a secure control plane (REST tokens, mutual TLS, joins) beside an ``--insecure`` one.

    .venv/bin/python bench/auth_overhead.py                 # 400 REST calls per side, 3 agents per side
    .venv/bin/python bench/auth_overhead.py --calls 100 --agents 1 --json /tmp/auth.json

Both servers run at once on 127.0.0.1, each a real ``llmgw server`` with its own data directory
(``llmgw.testing.system``), each holding the same 20 models (0 replicas, so no engine runs). Measured, the
two sides interleaved call by call so the machine's noise falls on both:

* REST: ``GET /api/v1/models`` over one keep-alive connection: with the admin's bearer token (looked up,
  role checked) against none (``--insecure``); p50 and p99 per side and their ratio.
* Login: ``POST /api/v1/login`` (one argon2id verification) p50; there is nothing to compare it with.
* Agents: from spawning ``llmgw agent`` to the node listed as connected: ``agent join`` (TLS handshake to
  read the CA, its hash checked, a key and CSR, the join, then the mutual-TLS stream) against an
  ``--insecure`` agent's plaintext stream; medians and ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw.testing import system as system_mod  # noqa: E402
from llmgw.testing.procs import Proc, wait_for  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _agent_ready_s(s: system_mod.System, node_id: str) -> float:
    t0 = time.monotonic()
    proc = Proc.start([*s.agent_command(node_id), "--heartbeat-interval", "1", "--stop-grace", "3"],
                      log_path=s.root / f"agent-{node_id}.log")
    s.agents[node_id] = proc
    wait_for(lambda: any(n["id"] == node_id and n["connected"] for n in s.get("/api/v1/nodes")["items"]),
             timeout=60, interval=0.02, what=f"{node_id} connected")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmgw-auth-bench-"))
    secure, insecure = system_mod.System(root / "secure"), system_mod.System(root / "insecure", secure=False)
    result: dict[str, Any] = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "calls": a.calls, "agents": a.agents}
    try:
        for s in (secure, insecure):
            s.start_server()
            for i in range(20):
                s.apply(system_mod.sim_model(f"m{i}", replicas=0))
        times: dict[str, list[float]] = {"secure": [], "insecure": []}
        with httpx.Client(base_url=secure.url, trust_env=False, timeout=30,
                          headers={"Authorization": f"Bearer {secure.token}"}) as cs, \
                httpx.Client(base_url=insecure.url, trust_env=False, timeout=30) as ci:
            for c in (cs, ci):  # warm: connections open, first-call costs paid
                for _ in range(20):
                    c.get("/api/v1/models").raise_for_status()
            for i in range(a.calls):
                order = [("secure", cs), ("insecure", ci)][:: 1 if i % 2 else -1]
                for name, c in order:
                    t0 = time.perf_counter()
                    c.get("/api/v1/models").raise_for_status()
                    times[name].append(time.perf_counter() - t0)
            logins = []
            for _ in range(10):
                t0 = time.perf_counter()
                r = cs.post("/api/v1/login", json={"username": "admin", "password": secure.admin_password})
                logins.append(time.perf_counter() - t0)
                r.raise_for_status()
        rest = {name: {"p50_ms": round(statistics.median(xs) * 1000, 3), "p99_ms": round(_pct(xs, 0.99) * 1000, 3)}
                for name, xs in times.items()}
        rest["ratio_p50"] = round(rest["secure"]["p50_ms"] / rest["insecure"]["p50_ms"], 3)
        rest["ratio_p99"] = round(rest["secure"]["p99_ms"] / rest["insecure"]["p99_ms"], 3)
        result["rest_get_models"] = rest
        result["login_p50_ms"] = round(statistics.median(logins) * 1000, 1)
        joins: dict[str, list[float]] = {"secure": [], "insecure": []}
        for i in range(a.agents):
            for name, s in ((("secure", secure), ("insecure", insecure)) if i % 2 == 0
                            else (("insecure", insecure), ("secure", secure))):
                joins[name].append(_agent_ready_s(s, f"n{i}"))
        agents: dict[str, Any] = {name: {"median_s": round(statistics.median(xs), 3),
                                         "all_s": [round(x, 3) for x in xs]} for name, xs in joins.items()}
        agents["ratio"] = round(agents["secure"]["median_s"] / agents["insecure"]["median_s"], 3)
        result["agent_start_to_connected"] = agents
    finally:
        secure.close()
        insecure.close()
    text = json.dumps(result, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
