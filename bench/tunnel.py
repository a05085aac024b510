"""Issue 33: what the engine tunnel adds, same run, on loopback: TTFT p50/p99 of a streamed request and streams/s
at concurrency 16, through ``router.client.Pool`` straight to an engine vs through a ``TunnelHub`` and an agent's
``TunnelDialer`` (mutual TLS, ``api.tunnel``) to the same engine, and as a standalone router does (``standalone``:
a TLS connection to the hub's port that says a router token, ``tunnel.remote.ControlTunnels`` and ``relay.Door``,
spliced onto the same tunnel), and as a standalone router's worker does (``workers``: ``relay.RelayTunnels`` to its
hub's loopback relay, ``tunnel.remote.workers_relay``, which opens the stream as ``standalone``; worker and hub run
in this one process here). The engine is an aiohttp SSE stream of 16 chunks (a near-zero-cost upstream, so the
figures are the path's). The paths are alternated request by request.

    .venv/bin/python bench/tunnel.py [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import tempfile
import time
from pathlib import Path

from aiohttp import web

from llmgw.agent.tunnel.dialer import TunnelDialer
from llmgw.api import tunnel
from llmgw.core import pki
from llmgw.router import client
from llmgw.router.tunnel.hub import TunnelHub, server_context
from llmgw.router.tunnel.relay import Door, RelayTunnels
from llmgw.router.tunnel.remote import ControlTunnels, workers_relay

CHUNKS = 16


async def chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(CHUNKS):
        await resp.write(b'data: {"choices": [{"delta": {"content": "tok%d"}}]}\n\n' % i)
    await resp.write(b"data: [DONE]\n\n")
    return resp


def keys(root: Path) -> tuple[ssl.SSLContext, ssl.SSLContext, str]:
    ca = pki.create_ca()
    server = pki.server_cert(ca, ["127.0.0.1"])
    key = pki.new_key()
    node = pki.sign_csr(ca, pki.create_csr("n1", key), "n1")
    for name, data in (("ca.crt", ca.cert_pem), ("s.crt", server.cert_pem), ("s.key", server.key_pem),
                       ("n.crt", node), ("n.key", pki.key_pem(key))):
        (root / name).write_bytes(data)
    agent = ssl.create_default_context(cafile=str(root / "ca.crt"))
    agent.load_cert_chain(str(root / "n.crt"), str(root / "n.key"))
    hub = server_context(ca_pem=ca.cert_pem, cert_file=str(root / "s.crt"), key_file=str(root / "s.key"))
    return hub, agent, ca.cert_pem.decode()


async def router_token(token: str) -> str:
    """The door's check (the control plane's is ``serving.tunnels.router_check``: a cached store lookup)."""
    return "" if token == "bench-token" else "refused"


async def one(pool: client.Pool, url: str) -> float:
    start = time.perf_counter()
    response = await pool.request(url, "/v1/chat/completions", b"Content-Type: application/json\r\n", b"{}")
    ttft = 0.0
    async for _ in response.iter_any():
        if not ttft:
            ttft = time.perf_counter() - start
    return ttft


async def streams_per_s(pool: client.Pool, url: str, requests: int, concurrency: int = 16) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def bounded() -> None:
        async with sem:
            await one(pool, url)
    start = time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(requests)))
    return requests / (time.perf_counter() - start)


async def main(requests: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    with tempfile.TemporaryDirectory() as tmp:
        hub_ctx, agent_ctx, ca_pem = keys(Path(tmp))
        up = asyncio.Event()
        hub = TunnelHub(context=hub_ctx, on_change=lambda node, is_up, why: up.set() if is_up else None)
        await hub.start("127.0.0.1", 0)
        dialer = TunnelDialer(node_id="n1", context=lambda: agent_ctx,
                              engines=lambda: {port: ("127.0.0.1", port, False)}, engine_ssl=lambda: True)
        dialer.offer("127.0.0.1", hub.port)
        await asyncio.wait_for(up.wait(), 10)
        door = Door(hub, router_token)
        hub.routers = door.protocol
        pool, remote = client.Pool(), client.Pool()
        pool.tunnels = hub
        cp = "https://127.0.0.1:1"
        remote.tunnels = ControlTunnels([cp], token="bench-token", ports={cp: hub.port}, ca_pem=lambda: ca_pem)
        relay = workers_relay([cp], token="bench-token", ports={cp: hub.port}, ca_pem=lambda: ca_pem, secret="w")
        worker = client.Pool()
        worker.tunnels = RelayTunnels(await relay.start(), secret="w")
        paths = {"direct": (pool, f"http://127.0.0.1:{port}"), "tunnel": (pool, tunnel.url("n1", port)),
                 "standalone": (remote, tunnel.url("n1", port)), "workers": (worker, tunnel.url("n1", port))}
        ttft: dict[str, list[float]] = {name: [] for name in paths}
        for on, url in paths.values():  # warm each
            for _ in range(20):
                await one(on, url)
        for _ in range(requests):
            for name, (on, url) in paths.items():
                ttft[name].append(await one(on, url))
        rate = {name: 0.0 for name in paths}
        for order in (list(paths.items()), list(reversed(paths.items()))):  # none goes first every time
            for name, (on, url) in order:
                rate[name] = max(rate[name], await streams_per_s(on, url, requests))
        for name, values in ttft.items():
            q = statistics.quantiles(values, n=100)
            print(f"{name:10s} TTFT p50 {q[49] * 1e3:.3f} ms  p99 {q[98] * 1e3:.3f} ms  streams/s {rate[name]:.0f}")
        d = statistics.quantiles(ttft["direct"], n=100)
        for name in ("tunnel", "standalone", "workers"):
            t = statistics.quantiles(ttft[name], n=100)
            print(f"{name:10s} added TTFT p50 {(t[49] - d[49]) * 1e3:+.3f} ms  p99 {(t[98] - d[98]) * 1e3:+.3f} ms  "
                  f"streams/s {rate[name] / rate['direct'] * 100:.0f}% of direct")
        pool.close()
        remote.close()
        worker.close()
        await relay.stop()
        door.stop()
        await dialer.close()
        await hub.stop()
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    asyncio.run(main(parser.parse_args().requests))
