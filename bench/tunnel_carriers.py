"""Issue 33: the tunnel's carrier, chosen by measuring: a stream of our framed multiplex (``api.tunnel``) against a
gRPC bidi call (grpc.aio, what the agent's control stream is), both over mutual TLS on loopback, same run.

Each request is what a streamed chat is on the wire: ~300 bytes up, 16 chunks of ~60 bytes down (the far end
answers at once: no engine, so the figures are the carrier's). TTFT p50/p99 at concurrency 1, streams/s at 16.

    .venv/bin/python bench/tunnel_carriers.py [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc

from llmgw.api import tunnel
from llmgw.core import pki

CHUNKS = [b'data: {"choices": [{"delta": {"content": "tok%02d"}}]}\n\n' % i for i in range(16)]
REQUEST = b"x" * 300


def material(root: Path) -> dict[str, bytes]:
    ca = pki.create_ca()
    server = pki.server_cert(ca, ["127.0.0.1"])
    key = pki.new_key()
    node = pki.sign_csr(ca, pki.create_csr("n1", key), "n1")
    files = {"ca.crt": ca.cert_pem, "s.crt": server.cert_pem, "s.key": server.key_pem, "n.crt": node,
             "n.key": pki.key_pem(key)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


async def mux_carrier(root: Path, files: dict[str, bytes]) -> tuple[Callable[[], Awaitable[float]], Callable]:
    """The router's end opens streams; the agent's end answers each at once."""
    loop = asyncio.get_running_loop()
    hub_side: asyncio.Future[tunnel.Mux] = loop.create_future()

    def made() -> tunnel.Mux:
        mux = tunnel.Mux(opener=True)
        loop.call_soon(lambda: hub_side.done() or hub_side.set_result(mux))
        return mux
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(root / "ca.crt"))
    server_ctx.load_cert_chain(str(root / "s.crt"), str(root / "s.key"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server = await loop.create_server(made, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]

    async def answer(stream: tunnel.Stream, _: int) -> str:
        def got(data: bytes) -> None:
            for chunk in CHUNKS:
                stream.write(chunk)
            stream.close()
        stream.on_data = got
        return ""
    client_ctx = ssl.create_default_context(cafile=str(root / "ca.crt"))
    client_ctx.load_cert_chain(str(root / "n.crt"), str(root / "n.key"))
    await loop.create_connection(lambda: tunnel.Mux(opener=False, on_open=answer), "127.0.0.1", port,
                                 ssl=client_ctx, server_hostname="127.0.0.1")
    mux = await hub_side

    async def one() -> float:
        start = time.perf_counter()
        stream = await mux.open(1, 5)
        done: asyncio.Future[None] = loop.create_future()
        first = [0.0]

        def data(_: bytes) -> None:
            if not first[0]:
                first[0] = time.perf_counter() - start
        stream.on_data = data
        stream.on_close = lambda why: done.done() or done.set_result(None)
        stream.write(REQUEST)
        await done
        return first[0]
    return one, server.close


async def grpc_carrier(root: Path, files: dict[str, bytes]) -> tuple[Callable[[], Awaitable[float]], Callable]:
    async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for _ in requests:
            for chunk in CHUNKS:
                yield chunk
            return

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Tunnel", {
        "Stream": grpc.stream_stream_rpc_method_handler(handle)}),))
    creds = grpc.ssl_server_credentials([(files["s.key"], files["s.crt"])], root_certificates=files["ca.crt"],
                                        require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        files["ca.crt"], files["n.key"], files["n.crt"]))
    call_stream = channel.stream_stream("/t.Tunnel/Stream")

    async def one() -> float:
        start = time.perf_counter()
        call = call_stream()
        await call.write(REQUEST)
        await call.done_writing()
        first = 0.0
        async for _ in call:
            if not first:
                first = time.perf_counter() - start
        return first

    def close() -> None:
        asyncio.get_running_loop().create_task(server.stop(0))
    return one, close


async def measure(one: Callable[[], Awaitable[float]], requests: int) -> tuple[list[float], float]:
    for _ in range(50):
        await one()
    ttft = [await one() for _ in range(requests)]
    sem = asyncio.Semaphore(16)

    async def bounded() -> None:
        async with sem:
            await one()
    start = time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(requests)))
    return ttft, requests / (time.perf_counter() - start)


async def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = material(root)
        carriers = {"mux": await mux_carrier(root, files), "grpc": await grpc_carrier(root, files)}
        results: dict[str, tuple[list[float], float]] = {}
        for order in (list(carriers), list(reversed(carriers))):  # neither goes first every time
            for name in order:
                ttft, rate = await measure(carriers[name][0], requests)
                old = results.get(name)
                results[name] = (ttft + (old[0] if old else []), max(rate, old[1] if old else 0.0))
        for name, (ttft, rate) in results.items():
            q = statistics.quantiles(ttft, n=100)
            print(f"{name:5s} TTFT p50 {q[49] * 1e3:.3f} ms  p99 {q[98] * 1e3:.3f} ms  streams/s {rate:.0f}")
        for _, close in carriers.values():
            close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    asyncio.run(main(parser.parse_args().requests))
