"""The router-to-engine hop on TLS (issue 28 §2): what it costs over plain HTTP, and why engines' own TLS.

Three llmgw standalone routers, each pinned to core 0 with ``taskset`` (as ``router_capacity.py``), each
with a one-endpoint table in front of a ``fast_upstream.py`` engine (canned answers, core 1):

* ``plain``: ``http://``, as engines on the router's host stay;
* ``engine-tls``: ``https://``, the engine's own TLS (vLLM, SGLang and llama.cpp take a key and certificate)
  with an engine certificate from ``llmgw.core.pki`` for node ``bench-node``; the table carries the CA
  (``engine_ca``), so the router verifies it (``router.enginetls``);
* ``relay-tls``: the alternative design, a TLS-terminating relay in front of a plain engine (what an agent
  fronting each engine would be): this script's own asyncio relay (``--relay``: TLS in, bytes copied to the
  engine on loopback, under uvloop when installed), verified by the router the same way.

After a warm-up, ``--rounds`` interleaved rounds measure every contender in turn (the machine's other load
spreads over all of them): ``wrk`` (core 1) at ``--connections`` kept-alive connections for whole answers and
for streams: req/s, and per CPU-second of the router (its one-core capacity, the figure a busy machine moves
least); the engine side's CPU per request (the engine's, plus the relay's); and ``--latency`` streamed
requests at concurrency 1 on one kept-alive connection: TTFT, whose samples over all rounds give p50/p99.
Last, the price of a new connection: ``client.Pool`` in this process opening ``--fresh`` fresh connections
to each, one request on each (TCP, the handshake and the certificate check, once per connection: the pool
keeps it alive after).

    .venv/bin/python bench/engine_tls.py [--rounds 5] [--seconds 4] [--latency 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import router_capacity
import router_peers

from llmgw.api.routing import EndpointDoc
from llmgw.core import pki
from llmgw.router import client, enginetls
from llmgw.testing.procs import Proc, free_port, wait_for

HERE = Path(__file__).resolve().parent
MODEL = router_peers.MODEL
NODE = "bench-node"
NAMES = ("plain", "engine-tls", "relay-tls")


# -- the relay (``--relay``): TLS in, plain out -------------------------------------------------------------
class _Pipe(asyncio.Protocol):
    """One side of a relayed connection; a front one (``backend`` set) dials the engine once its handshake is done."""

    def __init__(self, backend: int = 0) -> None:
        self.backend = backend
        self.peer: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.backend:
            asyncio.ensure_future(self._dial())

    async def _dial(self) -> None:
        try:
            _, back = await asyncio.get_running_loop().create_connection(_Pipe, "127.0.0.1", self.backend)
        except OSError:
            self.transport.close()
            return
        back.peer, self.peer = self.transport, back.transport
        if self.transport.is_closing():
            back.transport.close()
            return
        for data in self.pending:
            back.transport.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


async def _relay(port: int, backend: int, cert: str, key: str) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = await asyncio.get_running_loop().create_server(lambda: _Pipe(backend), "127.0.0.1", port, ssl=tls,
                                                            backlog=4096)
    async with server:
        await server.serve_forever()


# -- the bench ------------------------------------------------------------------------------------------------
def _engine_pair(ca: pki.Issued, workdir: Path) -> tuple[str, str]:
    key = pki.new_key()
    cert_path, key_path = workdir / "engine.crt", workdir / "engine.key"
    cert_path.write_bytes(pki.sign_engine_csr(ca, pki.create_csr(NODE, key), NODE))
    key_path.write_bytes(pki.key_pem(key))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def _listening(port: int) -> None:
    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(up, timeout=30, what=f"port {port}")


def _start_engines(workdir: Path, ca: pki.Issued, procs: list[Proc]) -> dict[str, tuple[str, list[int]]]:
    """Each contender's engine URL and the pids on the engine side (engine, relay)."""
    cert, key = _engine_pair(ca, workdir)
    out: dict[str, tuple[str, list[int]]] = {}
    ports = {name: free_port() for name in (*NAMES, "relay-backend")}

    def upstream(name: str, *tls: str) -> Proc:
        proc = Proc.start([*router_peers.pin(1), sys.executable, str(HERE / "fast_upstream.py"), "--port",
                           str(ports[name]), "--model", MODEL, *tls], log_path=workdir / f"{name}.log")
        procs.append(proc)
        _listening(ports[name])
        return proc

    out["plain"] = (f"http://127.0.0.1:{ports['plain']}", [upstream("plain").pid])
    out["engine-tls"] = (f"https://127.0.0.1:{ports['engine-tls']}",
                         [upstream("engine-tls", "--cert-file", cert, "--key-file", key).pid])
    backend = upstream("relay-backend")
    relay = Proc.start([*router_peers.pin(1), sys.executable, __file__, "--relay", str(ports["relay-tls"]),
                        str(ports["relay-backend"]), cert, key], log_path=workdir / "relay.log")
    procs.append(relay)
    _listening(ports["relay-tls"])
    out["relay-tls"] = (f"https://127.0.0.1:{ports['relay-tls']}", [backend.pid, relay.pid])
    return out


def _start_router(name: str, engine_url: str, ca: pki.Issued, workdir: Path, procs: list[Proc]) -> tuple[str, int]:
    port = free_port()
    table = {"version": 1, "engine_ca": ca.cert_pem.decode(), "models": [
        {"name": MODEL, "served_name": MODEL, "state": "Ready", "routing": "round_robin",
         "endpoints": [{"replica_id": f"r-{name}", "url": engine_url, "node": NODE}]}]}
    path = workdir / f"table-{name}.json"
    path.write_text(json.dumps(table))
    proc = Proc.start([*router_peers.pin(0), sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1",
                       "--port", str(port), "--table-file", str(path), "--log-level", "warning"],
                      env={**os.environ, "LLMGW_ROUTER_WORKERS": "1"}, log_path=workdir / f"router-{name}.log")
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/v1/models", timeout=60)
    return url, proc.pid


def _cpu(pids: list[int]) -> float:
    return sum(router_capacity.cpu_seconds(p) for p in pids)


def _round(url: str, router_pid: int, engine_pids: list[int], args: argparse.Namespace, workdir: Path,
           *, warm: bool) -> dict[str, float]:
    post = router_capacity.lua(workdir, "", stream=False)
    stream = router_capacity.lua(workdir, "", stream=True)
    if warm:
        router_capacity.ready(url, post)
        router_capacity.wrk(url, post, seconds=args.warmup, connections=args.connections)
    out: dict[str, float] = {}
    for kind, script in (("whole", post), ("stream", stream)):
        before_router, before_engine = router_capacity.cpu_seconds(router_pid), _cpu(engine_pids)
        run = router_capacity.wrk(url, script, seconds=args.seconds, connections=args.connections)
        router_s = router_capacity.cpu_seconds(router_pid) - before_router
        engine_s = _cpu(engine_pids) - before_engine
        n = run["requests"] or 1
        out[f"{kind}_rps"] = run["rps"]
        out[f"{kind}_cpu_rps"] = n / router_s if router_s > 0 else 0.0
        out[f"{kind}_engine_us"] = engine_s / n * 1e6
        out["bad"] = out.get("bad", 0.0) + run["non2xx"] + run["socket_errors"] + run["incomplete"]
    samples = asyncio.run(router_peers.latency(url, "", n=args.latency, warmup=20 if warm else 5, max_tokens=2))
    out["ttft"] = [t * 1000 for t, _ in samples]  # type: ignore[assignment]
    return out


async def _fresh(urls: dict[str, str], ca: pki.Issued, n: int) -> dict[str, float]:
    """Mean ms of one request on a fresh connection (connect, handshake and check included), per contender."""
    pool = client.Pool()
    endpoints = [EndpointDoc(f"r-{name}", url, node=NODE) for name, url in urls.items()]
    pool.expect(enginetls.expectations(ca.cert_pem.decode(), endpoints, {}))
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    out: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for i in range(n + 20):
            for name, url in urls.items():
                start = time.perf_counter()
                async with asyncio.timeout(10):  # a relay or engine that stops answering fails the bench, not hangs it
                    response = await pool.request(url, "/v1/chat/completions", b"Content-Type: application/json\r\n",
                                                  body, fresh=True)
                    await response.read()
                response.close()
                if i >= 20:
                    out[name].append((time.perf_counter() - start) * 1000)
                for connection in list(pool._all):  # fresh each time: the kept-alive one is closed
                    connection.abandon()
    finally:
        pool.close()
    return {name: statistics.median(values) for name, values in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0, help="each wrk run's duration")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--latency", type=int, default=300, help="streamed requests at concurrency 1 per round")
    parser.add_argument("--fresh", type=int, default=300, help="requests on fresh connections, per contender")
    parser.add_argument("--relay", nargs=4, metavar=("PORT", "BACKEND", "CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.relay:
        try:
            import uvloop
            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        runner(_relay(int(args.relay[0]), int(args.relay[1]), args.relay[2], args.relay[3]))
        return 0
    if not shutil.which("wrk"):
        print("wrk is not installed (`make bench-costs` installs it with apt-get as root)", file=sys.stderr)
        return 2
    if router_peers.pin(1):
        os.sched_setaffinity(0, {1})  # the latency client shares core 1, never the routers' core 0
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-engine-tls-"))
    ca = pki.create_ca()
    procs: list[Proc] = []
    try:
        engines = _start_engines(workdir, ca, procs)
        routers = {name: _start_router(name, engines[name][0], ca, workdir, procs) for name in NAMES}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in NAMES}
        for i in range(args.rounds):
            for name in NAMES:
                url, pid = routers[name]
                one = _round(url, pid, engines[name][1], args, workdir, warm=i == 0)
                rounds[name].append(one)
                print(f"round {i + 1} {name}: {one['whole_rps']:.0f} req/s, {one['stream_rps']:.0f} streams/s; "
                      f"per router CPU-second {one['whole_cpu_rps']:.0f} and {one['stream_cpu_rps']:.0f}; TTFT p50 "
                      f"{router_peers.pct(one['ttft'], 50):.3f} ms" + (f" ({one['bad']:.0f} failed)" if one["bad"]
                                                                       else ""), flush=True)
        fresh = asyncio.run(_fresh({name: engines[name][0] for name in NAMES}, ca, args.fresh))
        report(rounds, fresh, args)
    finally:
        for proc in reversed(procs):
            proc.stop()
    print(f"logs in {workdir}")
    return 0


def report(rounds: dict[str, list[dict[str, float]]], fresh: dict[str, float], args: argparse.Namespace) -> None:
    rows = {}
    for name, measured in rounds.items():
        ttft = [t for one in measured for t in one["ttft"]]  # type: ignore[attr-defined]
        row = {k: statistics.median(one[k] for one in measured)
               for k in measured[0] if k not in ("ttft", "bad")}
        row.update(p50=router_peers.pct(ttft, 50), p99=router_peers.pct(ttft, 99), fresh=fresh[name],
                   bad=sum(one["bad"] for one in measured))
        rows[name] = row
    base = rows["plain"]
    print(f"\nmedians of {args.rounds} interleaved rounds; wrk -t1 -c{args.connections} -d{args.seconds:g}s kept "
          f"alive; router on core 0, engines, relay and clients on core 1; TTFT over {args.rounds * args.latency} "
          "streamed requests at concurrency 1")
    print(f"{'':11} {'req/s':>7} {'x':>5} {'str/s':>7} {'x':>5} {'req/cpu-s':>9} {'x':>5} {'str/cpu-s':>9} {'x':>5} "
          f"{'ttft p50':>8} {'+p50':>6} {'ttft p99':>8} {'+p99':>6} {'engine us/req':>13} {'fresh conn ms':>13}")
    for name, row in rows.items():
        def x(key: str, row: dict[str, float] = row) -> str:
            return f"{row[key] / base[key]:5.2f}" if base[key] else "    -"
        print(f"{name:11} {row['whole_rps']:7.0f} {x('whole_rps')} {row['stream_rps']:7.0f} {x('stream_rps')} "
              f"{row['whole_cpu_rps']:9.0f} {x('whole_cpu_rps')} {row['stream_cpu_rps']:9.0f} {x('stream_cpu_rps')} "
              f"{row['p50']:8.3f} {row['p50'] - base['p50']:+6.3f} {row['p99']:8.3f} {row['p99'] - base['p99']:+6.3f} "
              f"{row['whole_engine_us']:13.1f} {row['fresh']:13.3f}"
              + (f"  ({row['bad']:.0f} failed)" if row["bad"] else ""))


if __name__ == "__main__":
    sys.exit(main())
