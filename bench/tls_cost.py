"""What TLS on the router's listener costs, against plain HTTP, in one run (issue 28).

llmgw's standalone router (one process, pinned to core 0) in front of ``fast_upstream.py`` (core 1), three
ways at once, measured in interleaved rounds so the machine's other load falls on all alike:

* ``plain``: plain HTTP, as on loopback;
* ``plain-marked``: plain HTTP with ``--plain-http`` (every answer carries ``X-Llmgw-Plain-Http: 1``): the
  mark's cost, which should be nothing (it is part of the date line the server caches once a second);
* ``tls``: HTTPS (``--tls-cert/--tls-key``, an ECDSA P-256 certificate from ``core.pki``, as the cluster CA
  issues), TLS 1.3 with the client's defaults.

Each round: ``wrk`` (core 1) posting 1-token chat completions with keep-alive (``-c64``), the same streamed,
and the same with ``Connection: close`` (a TCP connection, and for ``tls`` a TLS handshake, per request);
each as req/s and per CPU-second of the router (its one-core capacity, steadier on a shared machine). Then
TTFT at concurrency 1: streamed requests on one keep-alive connection, and on a new connection each (the
handshake included), p50 and p99.

    .venv/bin/python bench/tls_cost.py [--seconds 4] [--rounds 3] [--latency 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import router_capacity
import router_peers

from llmgw.core import pki
from llmgw.testing.procs import Proc, free_port

HERE = Path(__file__).resolve().parent
MODEL = router_peers.MODEL


def close_script(workdir: Path, *, stream: bool) -> Path:
    """router_capacity's wrk script with ``Connection: close``: a new connection per request."""
    base = router_capacity.lua(workdir, "", stream=stream)
    path = workdir / f"close-{base.name}"
    path.write_text(base.read_text() + 'wrk.headers["Connection"] = "close"\n')
    return path


async def ttft(url: str, ctx: ssl.SSLContext | None, *, n: int, fresh: bool) -> list[float]:
    """TTFT (ms) of ``n`` streamed requests at concurrency 1: on one keep-alive connection, or each on a new one."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Content-Type": "application/json"}
    out: list[float] = []
    connector = aiohttp.TCPConnector(limit=1, ssl=ctx if ctx is not None else False, force_close=fresh)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(n + 20):
            start = time.perf_counter()
            got = 0.0
            async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                async for line in resp.content:
                    if not got and b'"content"' in line:
                        got = time.perf_counter() - start
            if i >= 20:   # the first 20 warm up
                out.append(got * 1000)
    return out


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100)[int(p) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency", type=int, default=500, help="streamed requests per TTFT figure")
    args = parser.parse_args()
    args.warmup = 1.0
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-tls-cost-"))
    ca = pki.create_ca()
    issued = pki.server_cert(ca, ["127.0.0.1"])
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    (workdir / "router.pem").write_bytes(issued.cert_pem + ca.cert_pem)
    (workdir / "router.key").write_bytes(issued.key_pem)
    os.chmod(workdir / "router.key", 0o600)
    client_ctx = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    if router_peers.pin(1):
        os.sched_setaffinity(0, {1})
    procs: list[Proc] = []
    try:
        up_port = free_port()
        procs.append(Proc.start([*router_peers.pin(1), sys.executable, str(HERE / "fast_upstream.py"), "--port",
                                 str(up_port), "--model", MODEL], log_path=workdir / "upstream.log"))
        procs[-1].wait_http(f"http://127.0.0.1:{up_port}/health", timeout=30)
        table = workdir / "table.json"
        table.write_text(json.dumps({"version": 1, "models": [{"name": MODEL, "state": "Ready", "endpoints": [
            {"replica_id": "r0", "url": f"http://127.0.0.1:{up_port}"}]}]}))
        variants = {"plain": [], "plain-marked": ["--plain-http"],
                    "tls": ["--tls-cert", str(workdir / "router.pem"), "--tls-key", str(workdir / "router.key")]}
        routers: dict[str, tuple[str, int]] = {}
        for name, extra in variants.items():
            port = free_port()
            proc = Proc.start([*router_peers.pin(0), sys.executable, "-m", "llmgw.router.standalone", "--port",
                               str(port), "--table-file", str(table), "--workers", "1", "--log-level", "warning",
                               *extra], log_path=workdir / f"{name}.log")
            procs.append(proc)
            url = f"{'https' if name == 'tls' else 'http'}://127.0.0.1:{port}"
            proc.wait_http(url + "/v1/models", timeout=30, context=client_ctx if name == "tls" else None)
            routers[name] = (url, proc.pid)
        post, stream = router_capacity.lua(workdir, "", stream=False), router_capacity.lua(workdir, "", stream=True)
        close = close_script(workdir, stream=False)
        rows: dict[str, dict[str, list[float]]] = {name: {} for name in routers}
        for i in range(args.rounds):
            for name, (url, pid) in routers.items():
                if i == 0:
                    router_capacity.wrk(url, post, seconds=args.warmup, connections=args.connections)
                for label, script in (("keep-alive", post), ("streams", stream), ("new conn", close)):
                    got = router_capacity.per_cpu_second(url, script, args, pid)
                    bad = got["non2xx"] + got["socket_errors"] + got["incomplete"]
                    rows[name].setdefault(label, []).append(got["rps"])
                    rows[name].setdefault(label + " /cpu-s", []).append(got["per_cpu_s"])
                    print(f"round {i + 1} {name} {label}: {got['rps']:.0f} req/s, {got['per_cpu_s']:.0f} per "
                          f"CPU-second" + (f" ({bad:.0f} failed)" if bad else ""), flush=True)
        print("\n| router | keep-alive req/s (per CPU-s) | streams/s (per CPU-s) | new connection each req/s "
              "(per CPU-s) | TTFT p50/p99 ms, keep-alive | TTFT p50/p99 ms, new connection |")
        print("|---|---|---|---|---|---|")
        for name, (url, _) in routers.items():
            ctx = client_ctx if name == "tls" else None
            kept = asyncio.run(ttft(url, ctx, n=args.latency, fresh=False))
            fresh = asyncio.run(ttft(url, ctx, n=args.latency, fresh=True))
            med = {k: statistics.median(v) for k, v in rows[name].items()}
            print(f"| {name} | {med['keep-alive']:.0f} ({med['keep-alive /cpu-s']:.0f}) | {med['streams']:.0f} "
                  f"({med['streams /cpu-s']:.0f}) | {med['new conn']:.0f} ({med['new conn /cpu-s']:.0f}) | "
                  f"{pct(kept, 50):.3f} / {pct(kept, 99):.3f} | {pct(fresh, 50):.3f} / {pct(fresh, 99):.3f} |",
                  flush=True)
    finally:
        for proc in procs:
            proc.stop()
    print(f"logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
