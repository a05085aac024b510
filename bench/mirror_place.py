"""Time to place a many-file model on N nodes through the cluster's pull-through mirror, against N nodes each
running ``huggingface_hub.snapshot_download`` from the same mirror (a peer with no cluster-level fetcher).

    .venv/bin/python bench/mirror_place.py                     # 8 nodes, 100 x 2 MiB + config.json, N=3
    .venv/bin/python bench/mirror_place.py --nodes 4 --runs 1 --json /tmp/place.json

Set-up, all on 127.0.0.1: an "origin" ``llmgw mirror`` holding fake HF repos (``llmgw.testing.hfrepo``; it
stands for huggingface.co), an "edge" ``llmgw mirror --upstream ORIGIN`` (the cluster's mirror, empty at the
start), a real ``llmgw server --hub-endpoint EDGE`` and N agents (``llmgw.testing.system``), each with its
own weights cache. Every run uses a repo of its own (same sizes, its own name), so the edge and the nodes are
cold every time; the two sides alternate, the first switching every run; medians over --runs.

* llmgw: apply a sim model (``source: hf://org/NAME``, ``replicas: N``, ``placement: spread``; the sim
  loads nothing but its agent fetches the weights first); timed from the apply to the last node's
  "fetched" log line (fetched), and to all N replicas Ready (polled every 0.1 s).
* peer: N processes, started and with ``huggingface_hub`` imported before the clock starts (the agents were
  running too), each calling ``snapshot_download`` (its default 8 workers, its default cache layout in a
  directory of its own, ``allow_patterns`` the files the fetcher takes: *.safetensors, *.json) with
  ``HF_ENDPOINT`` = the edge; timed from "go" to the last one's exit.

Both columns also give the edge's ``/admin/stats`` upstream counts for the run: with single-flight
pull-through, N nodes asking for F files should cost F upstream file fetches either way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llmgw.testing import hfrepo, procs
from llmgw.testing.system import System, sim_model

MIB = 2**20

# The peer's node: import first, say so, download on "go", print the bytes it holds.
PEER = r"""
import os, sys
from huggingface_hub import snapshot_download
print("ready", flush=True)
sys.stdin.readline()
path = snapshot_download(sys.argv[1], cache_dir=sys.argv[2], allow_patterns=["*.safetensors", "*.json"])
print(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs), flush=True)
"""


def repo_files(count: int, size: int) -> dict[str, bytes]:
    rng = random.Random(7)
    files = {f"model-{k + 1:05d}-of-{count:05d}.safetensors": rng.randbytes(size) for k in range(count)}
    files["config.json"] = json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}).encode()
    return files


def upstream_stats(edge: str) -> dict[str, int]:
    doc = httpx.get(f"{edge}/admin/stats", timeout=10, trust_env=False).json()["upstream"]
    return {k: int(doc[k]) for k in ("api_calls", "file_fetches", "bytes")}


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a}


_LOGTIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def fetched_at(log: Path, source: str) -> float | None:
    """Unix time of the agent's "fetched SOURCE into" line (its log's local-time stamp), None if absent."""
    for line in log.read_text(errors="replace").splitlines():
        if f"fetched {source} into" in line and (m := _LOGTIME.match(line)):
            return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def llmgw_run(s: System, edge: str, repo: str, nodes: int, total: int) -> dict[str, Any]:
    name = repo.split("/")[1]
    before = upstream_stats(edge)
    t0 = time.time()
    s.apply(sim_model(name, replicas=nodes, source=f"hf://{repo}", placement="spread"))

    def ready() -> list[dict[str, Any]] | None:
        rs = s.replicas(name)
        return rs if len(rs) == nodes and all(r["phase"] == "Ready" for r in rs) else None
    rs = procs.wait_for(ready, timeout=900, interval=0.1, what=f"{nodes} replicas of {name} Ready")
    t_ready = time.time()
    assert isinstance(rs, list)
    on = sorted({r["node"] for r in rs})
    logs = [s.root / f"agent-{n}.log" for n in on]
    done = procs.wait_for(lambda: all(fetched_at(p, f"hf://{repo}") for p in logs), timeout=30,
                          what="every agent's 'fetched' line")
    assert done
    fetched = max(fetched_at(p, f"hf://{repo}") or 0.0 for p in logs)
    held = [sum(f.stat().st_size for f in (s.root / n / "weights").rglob("*.safetensors")
                if ".partial" not in f.parts) for n in on]
    stats = diff(before, upstream_stats(edge))
    s.request("DELETE", f"/api/v1/models/{name}")
    procs.wait_for(lambda: not s.replicas(name), timeout=120, interval=0.2, what=f"{name} deleted")
    assert all(h >= total - MIB for h in held), f"nodes hold {held} safetensors bytes, expected about {total}"
    return {"side": "llmgw", "repo": repo, "nodes_used": len(on), "fetched_s": fetched - t0,
            "ready_s": t_ready - t0, "upstream": stats}


def peer_run(edge: str, repo: str, nodes: int, work: Path, total: int) -> dict[str, Any]:
    env = {**os.environ, "HF_ENDPOINT": edge, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_ETAG_TIMEOUT": "30", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(k, None)
    before = upstream_stats(edge)
    kids = [subprocess.Popen([sys.executable, "-c", PEER, repo, str(work / f"peer{i}")], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for i in range(nodes)]
    try:
        for k in kids:
            assert k.stdout is not None
            line = k.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"peer {k.pid} did not start: {line!r} {k.stderr.read() if k.stderr else ''}")
        t0 = time.time()
        for k in kids:
            assert k.stdin is not None
            k.stdin.write("go\n")
            k.stdin.flush()
        outs = [k.communicate(timeout=900) for k in kids]
        t_end = time.time()
    finally:
        for k in kids:
            if k.poll() is None:
                k.kill()
                k.wait()
    for k, (out, err) in zip(kids, outs, strict=True):
        if k.returncode:
            raise RuntimeError(f"peer {k.pid} exited {k.returncode}: {err[-2000:]}")
        got = int(out.split()[-1])
        assert got >= total, f"peer {k.pid} holds {got} bytes, expected {total}"
    stats = diff(before, upstream_stats(edge))
    shutil.rmtree(work, ignore_errors=True)
    return {"side": "peer", "repo": repo, "nodes_used": nodes, "fetched_s": t_end - t0, "ready_s": None,
            "upstream": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--files", type=int, default=100, help="safetensors files (config.json comes on top)")
    ap.add_argument("--file-size", type=float, default=2.0, help="MiB per safetensors file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tmp", type=Path, default=None, help="where the temp dir goes (default: the system's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    size = int(args.file_size * MIB)
    total = args.files * size
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-place-", dir=args.tmp))
    started: list[procs.Proc] = []
    s = System(tmp / "sys", server_args=())
    runs: list[dict[str, Any]] = []
    try:
        files = repo_files(args.files, size)
        order = [(i, side) for i in range(args.runs)
                 for side in (("llmgw", "peer") if i % 2 == 0 else ("peer", "llmgw"))]
        for i, side in order:
            hfrepo.write_repo(tmp / "origin", f"org/m-{side}-{i}", files)
        del files
        ports = procs.free_port(), procs.free_port()
        origin, edge = (f"http://127.0.0.1:{p}" for p in ports)
        for url, argv in ((origin, ["--dir", str(tmp / "origin"), "--port", str(ports[0])]),
                          (edge, ["--dir", str(tmp / "edge"), "--port", str(ports[1]), "--upstream", origin])):
            p = procs.Proc.start([sys.executable, "-m", "llmgw", "mirror", *argv, "--log-level", "warning"],
                                 log_path=tmp / f"mirror-{len(started)}.log")
            started.append(p)
            p.wait_http(f"{url}/healthz", timeout=30)
        s.server_args = ("--hub-endpoint", edge)
        s.start_server()
        t0 = time.perf_counter()
        for n in range(args.nodes):
            s.start_agent(f"node{n + 1}")
        print(f"{args.nodes} agents up in {time.perf_counter() - t0:.1f} s; "
              f"model: {args.files} x {args.file_size:g} MiB + config.json", flush=True)
        for i, side in order:
            repo = f"org/m-{side}-{i}"
            r = (llmgw_run(s, edge, repo, args.nodes, total) if side == "llmgw"
                 else peer_run(edge, repo, args.nodes, tmp / "peers", total))
            runs.append(r)
            ready = f", all Ready {r['ready_s']:.2f} s" if r["ready_s"] is not None else ""
            print(f"  run {i + 1}/{args.runs} {side}: fetched on {r['nodes_used']} nodes {r['fetched_s']:.2f} s"
                  f"{ready}; upstream {r['upstream']}", flush=True)
    finally:
        s.close()
        for p in reversed(started):
            p.stop(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["side"] == side)
    lf, lr, pf = med("llmgw", "fetched_s"), med("llmgw", "ready_s"), med("peer", "fetched_s")
    ups = {side: [r["upstream"]["file_fetches"] for r in runs if r["side"] == side] for side in ("llmgw", "peer")}
    mb = args.nodes * total / 1e6
    print(f"\n{args.nodes} nodes x {args.files + 1} files ({total / MIB:.0f} MiB each node), median of {args.runs}")
    print(f"{'side':<8} {'all fetched s':>14} {'all Ready s':>12} {'MB/s to nodes':>14} {'upstream file fetches':>22}")
    print(f"{'llmgw':<8} {lf:>14.2f} {lr:>12.2f} {mb / lf:>14.0f} {str(ups['llmgw']):>22}")
    print(f"{'peer':<8} {pf:>14.2f} {'-':>12} {mb / pf:>14.0f} {str(ups['peer']):>22}")
    print(f"peer time / llmgw time: fetched {pf / lf:.2f}x, Ready {pf / lr:.2f}x (above 1: llmgw is faster)")
    doc = {"nodes": args.nodes, "files": args.files + 1, "file_size": size, "runs": runs, "cpus": os.cpu_count(),
           "median": {"llmgw_fetched_s": lf, "llmgw_ready_s": lr, "peer_fetched_s": pf},
           "ratio_peer_over_llmgw": {"fetched": pf / lf, "ready": pf / lr}}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
