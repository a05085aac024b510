"""A server's router worker passing what is not the OpenAI API to the server (``router.passthrough``), and the
server's side of it (``serving.routerworkers``: the internal listener, the public port's header scrub).

Real sockets throughout: the worker is a ``Passthrough`` on the router's own HTTP server, the server's internal
listener an ``Internal`` on another, and behind it a small ASGI app standing for the server's front that answers
what it was given (``echo``) or streams (``/stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from llmgw.router import asgi, passthrough
from llmgw.router import server as router_server
from llmgw.router.app import RouterApp
from llmgw.router.table import TableHolder
from llmgw.serving import routerworkers

SECRET = "the-servers-secret"
CHUNK = 256 << 10
CHUNKS = 8
PAUSE_S = 0.25


async def front(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    """The server's front, as far as these tests need: ``/stream`` streams, anything else says what it got."""
    body = await asgi.read_body(receive, limit=1 << 30)
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream")]})
        for i in range(CHUNKS):
            await send({"type": "http.response.body", "body": bytes([65 + i]) * CHUNK, "more_body": True})
            await asyncio.sleep(PAUSE_S)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    doc = {"method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
           "scheme": scope["scheme"],
           "client": list(scope["client"] or ()), "headers": [[n.decode(), v.decode()] for n, v in scope["headers"]],
           "body_sha256": hashlib.sha256(body).hexdigest(), "body_len": len(body)}
    await send({"type": "http.response.start", "status": 201, "headers": [
        (b"content-type", b"application/json"), (b"x-answer", b"yes"), (b"keep-alive", b"timeout=99"),
        (b"proxy-authenticate", b"Basic"), (b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]})
    await send({"type": "http.response.body", "body": json.dumps(doc).encode(), "more_body": False})


@contextlib.asynccontextmanager
async def listening(app: Any) -> AsyncIterator[str]:
    """``app`` on the router's HTTP server at 127.0.0.1 on a free port; its URL."""
    server = router_server.Server(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.start_on(sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await server.shutdown(0.5)


@contextlib.asynccontextmanager
async def worker_and_server(internal_url: str | None = None) -> AsyncIterator[tuple[str, str]]:
    """A worker passing to a server's internal listener (or to ``internal_url``); both URLs."""
    internal = routerworkers.Internal(SECRET, front, services=None)  # type: ignore[arg-type]  # no hub call here
    async with listening(internal) as server_url:
        worker = passthrough.Passthrough(RouterApp(TableHolder()), internal_url or server_url, secret=SECRET)
        await worker.startup()
        try:
            async with listening(worker) as worker_url:
                yield worker_url, server_url
        finally:
            await worker.shutdown()


def headers_of(doc: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in doc["headers"]:
        out.setdefault(name, []).append(value)
    return out


def test_a_passed_request_keeps_end_to_end_headers_loses_hop_by_hop_ones_and_names_the_real_client() -> None:
    async def main() -> None:
        async with worker_and_server() as (worker, _), httpx.AsyncClient(trust_env=False, timeout=10) as client:
            body = bytes(range(256)) * (12 << 10)  # 3 MiB
            resp = await client.post(worker + "/api/v1/things%2Fx?a=1&b=%20", content=body, headers={
                "Authorization": "Bearer the-clients-own", "X-Custom": "kept", "Connection": "keep-alive, X-Custom",
                "Keep-Alive": "timeout=5", "TE": "trailers", "Upgrade": "h2c", "Proxy-Authorization": "Basic x",
                "Trailer": "X-Sum", "x-llmgw-forwarded-for": "6.6.6.6", "x-llmgw-internal": "a guess",
                "x-llmgw-forwarded-proto": "https"})
            assert resp.status_code == 201, resp.text
            doc = resp.json()
            got = headers_of(doc)
            assert doc["method"] == "POST" and doc["path"] == "/api/v1/things/x" and doc["query"] == "a=1&b=%20"
            assert doc["body_len"] == len(body) and doc["body_sha256"] == hashlib.sha256(body).hexdigest()
            assert got["authorization"] == ["Bearer the-clients-own"] and got["x-custom"] == ["kept"]
            for hop in ("connection", "keep-alive", "te", "upgrade", "proxy-authorization", "trailer",
                        "transfer-encoding"):
                assert hop not in got, (hop, got)
            # The client's claim of an address and of the secret never reach the front; its real address does.
            assert "x-llmgw-forwarded-for" not in got and "x-llmgw-internal" not in got
            assert doc["client"][0] == "127.0.0.1"
            # Nor its claim of a scheme: the worker's listener is plain here, so the server sees http.
            assert doc["scheme"] == "http" and "x-llmgw-forwarded-proto" not in got
            # The answer: end-to-end headers (each Set-Cookie), none of the front's hop-by-hop ones.
            assert resp.headers["x-answer"] == "yes" and resp.headers.get_list("set-cookie") == ["a=1", "b=2"]
            assert "proxy-authenticate" not in resp.headers and resp.headers.get("keep-alive") is None
            # /v1/ is the worker's own: the router answers, nothing is passed.
            models = await client.get(worker + "/v1/models")
            assert models.status_code == 200 and models.json()["object"] == "list" and "x-answer" not in models.headers

    asyncio.run(main())


def test_the_internal_listener_answers_only_the_secret_and_trusts_the_address_only_with_it() -> None:
    async def main() -> None:
        async with worker_and_server() as (_, server), httpx.AsyncClient(trust_env=False, timeout=10) as client:
            for headers in ({}, {"x-llmgw-internal": "wrong"}, {"Authorization": "Bearer wrong"},
                            {"x-llmgw-forwarded-for": "10.1.2.3"}, {"Authorization": f"Basic {SECRET}"}):
                resp = await client.get(server + "/api/v1/models", headers=headers)
                assert resp.status_code == 401, (headers, resp.text)
            # The hub's calls take the secret as a bearer token; a passed request may not use that form.
            resp = await client.get(server + "/api/v1/models", headers={"Authorization": f"Bearer {SECRET}"})
            assert resp.status_code == 404, resp.text
            resp = await client.get(server + "/api/v1/models", headers={
                "x-llmgw-internal": SECRET, "x-llmgw-forwarded-for": "10.1.2.3", "Authorization": "Bearer user"})
            assert resp.status_code == 201
            doc = resp.json()
            assert doc["client"] == ["10.1.2.3", 0] and doc["scheme"] == "http"
            assert headers_of(doc)["authorization"] == ["Bearer user"]
            # A worker on a TLS listener says https: the server then sets its session cookie Secure.
            resp = await client.get(server + "/api/v1/models", headers={
                "x-llmgw-internal": SECRET, "x-llmgw-forwarded-proto": "https"})
            assert resp.json()["scheme"] == "https" and "x-llmgw-forwarded-proto" not in headers_of(resp.json())
            assert "x-llmgw-internal" not in headers_of(doc) and "x-llmgw-forwarded-for" not in headers_of(doc)

    asyncio.run(main())


def test_the_public_port_drops_the_headers_only_a_worker_may_set() -> None:
    async def main() -> None:
        async with listening(routerworkers.untrusting(front)) as public, \
                httpx.AsyncClient(trust_env=False, timeout=10) as client:
            resp = await client.get(public + "/api/v1/login", headers={
                "x-llmgw-forwarded-for": "10.9.9.9", "x-llmgw-internal": SECRET, "X-Other": "1",
                "x-llmgw-forwarded-proto": "https"})
            doc = resp.json()
            assert doc["client"][0] == "127.0.0.1"
            assert set(headers_of(doc)) >= {"x-other"}
            assert not {"x-llmgw-internal", "x-llmgw-forwarded-for", "x-llmgw-forwarded-proto"} & set(headers_of(doc))

    asyncio.run(main())


def test_a_large_streamed_answer_is_relayed_chunk_by_chunk_as_it_comes() -> None:
    async def main() -> None:
        async with worker_and_server() as (worker, _), httpx.AsyncClient(trust_env=False, timeout=30) as client:
            t0 = time.monotonic()
            arrivals: list[tuple[float, int]] = []
            got = bytearray()
            async with client.stream("GET", worker + "/stream") as resp:
                assert resp.status_code == 200
                async for chunk in resp.aiter_raw():
                    got += chunk
                    arrivals.append((time.monotonic() - t0, len(got)))
            assert bytes(got) == b"".join(bytes([65 + i]) * CHUNK for i in range(CHUNKS))
            total = arrivals[-1][0]
            assert total >= (CHUNKS - 1) * PAUSE_S * 0.9, arrivals
            # The first chunk was in the client's hands long before the front sent its last one: not buffered.
            first_whole = next(t for t, n in arrivals if n >= CHUNK)
            assert first_whole < total - 3 * PAUSE_S, arrivals

    asyncio.run(main())


def test_a_server_that_does_not_answer_is_a_502_from_the_worker() -> None:
    async def main() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sock.close()
        async with worker_and_server(closed) as (worker, _), httpx.AsyncClient(trust_env=False, timeout=10) as client:
            resp = await client.get(worker + "/healthz")
            assert resp.status_code == 502 and resp.json()["error"]["code"] == "server_unreachable"

    asyncio.run(main())
