"""The admin UI's overview with a big cluster: response time p50/p99 and page weight.

    .venv/bin/python bench/ui_overview.py                     # 1000 nodes, 2000 replicas, 50 requests each
    .venv/bin/python bench/ui_overview.py --nodes 200 --replicas 400 --requests 20

Starts its own ``llmgw server --insecure`` and ``llmgw sim fleet`` as bench/fleet.py does (the
simulated agents dial plaintext, so the server must be insecure), applies sim models for
``--replicas`` replicas in all (1000 a model, the spec's limit), waits for all Ready, then times
``GET /ui/``, the four fragments and a last node page, ``--requests`` times each, one at a time.

The UI under ``--insecure``: ``POST /api/v1/login`` answers 400 ("nothing needs a login"), so the
UI's login form cannot give a browser a session; every API call is let through as the insecure
admin. The UI only checks that a session cookie is present before calling the API, so the bench
sends a placeholder ``llmgw_session`` cookie and the API (insecure) answers as for an admin.

Time is measured by the client on loopback from sending the request to the last byte (server time
plus a loopback round trip, well under a millisecond). Weight is the HTML's bytes; the full first
load adds the two static files (htmx.min.js, ui.css), cacheable, listed on their own rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet as fleet_bench  # noqa: E402  (bench/fleet.py: its Server and Fleet processes)

from llmgw.control.ui.nodes_page import NODES_PER_PAGE  # noqa: E402
from llmgw.testing.procs import wait_for  # noqa: E402

#: The UI wants a session cookie before it calls the API; under --insecure the API ignores its value.
COOKIE = {"cookie": "llmgw_session=bench-insecure", "accept": "text/html"}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def measure(c: httpx.Client, path: str, n: int) -> dict[str, Any]:
    times, size = list[float](), 0
    for _ in range(n):
        t0 = time.perf_counter()
        resp = c.get(path, headers=COOKIE)
        times.append(time.perf_counter() - t0)
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
        size = len(resp.content)
    return {"path": path, "p50_ms": 1000 * statistics.median(times), "p99_ms": 1000 * pct(times, 0.99),
            "bytes": size}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--replicas", type=int, default=2000)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--mix", default="h100:0.5,l40s:0.5")
    ns = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmgw-ui-bench-"))
    server = fleet_bench.Server(work, core=None, node_grace_s=30.0)
    fleet = None
    most = fleet_bench.MAX_REPLICAS
    per_model = [min(most, ns.replicas - i) for i in range(0, ns.replicas, most)]
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=120, trust_env=False) as c:
            fleet = fleet_bench.Fleet(work, server=server, nodes=ns.nodes, heartbeat_s=5.0, mix=ns.mix, core=None)
            wait_for(lambda: fleet_bench.connected(c) >= ns.nodes, timeout=300, interval=0.5,
                     what=f"{ns.nodes} registered")
            for i, k in enumerate(per_model):
                resp = c.post("/api/v1/models", json={"apiVersion": "llmgw/v1", "kind": "Model",
                                                      "metadata": {"name": f"fleet-{i}"},
                                                      "spec": {"engine": "sim", "served_name": f"fleet-{i}",
                                                               "replicas": k}})
                assert resp.status_code in (200, 201), resp.text

            def ready() -> int:
                return sum(int(m["status"]["ready_replicas"]) for m in c.get("/api/v1/models").json()["items"])
            wait_for(lambda: ready() >= ns.replicas, timeout=600, interval=1, what=f"{ns.replicas} replicas Ready")
            last = -(-ns.nodes // NODES_PER_PAGE)
            paths = ["/ui/", "/ui/fragments/nodes", "/ui/fragments/models", "/ui/fragments/events",
                     "/ui/fragments/traffic", f"/ui/fragments/nodes?page={last}",
                     # what the pages are made of, straight from the API: the part of the time that is not the UI's
                     f"/api/v1/nodes?offset={(last - 1) * NODES_PER_PAGE}&limit={NODES_PER_PAGE}",
                     "/api/v1/models", "/api/v1/nodes"]
            measure(c, "/ui/", 3)  # warm: templates compiled, first-call caches filled
            rows = [measure(c, path, ns.requests) for path in paths]
            for static in ("/ui/static/htmx.min.js", "/ui/static/ui.css"):
                rows.append({"path": static, "p50_ms": None, "p99_ms": None, "bytes": len(c.get(static).content)})
    except BaseException:
        print(f"failed: the servers' logs are kept in {work}", file=sys.stderr)
        raise
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()
    shutil.rmtree(work, ignore_errors=True)  # only after a run that went well: a failed one's logs stay
    print(f"{ns.nodes} nodes, {ns.replicas} replicas ({len(per_model)} models), {ns.requests} requests each, "
          "one at a time, loopback\n")
    print("| path | p50 ms | p99 ms | bytes |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| `{r['path']}` | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {r['bytes']:,} |")
    out = Path(__file__).resolve().parent / "results" / f"ui-overview-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"nodes": ns.nodes, "replicas": ns.replicas, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
