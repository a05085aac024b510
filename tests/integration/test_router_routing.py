"""Routing end to end: a router process choosing among sim engine processes by prefix, load and health.

Every upstream is a real HTTP server on 127.0.0.1; which one served a request is
read from the router's ``x-llmgw-upstream`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from llmgw.router import table, upstream
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.routed import Spawner


class Cluster(Spawner):
    """Starts sim engines and one router for a test, and stops them all at its end."""

    def sims(self, n: int, *extra: str, health: int = 200) -> list[str]:
        """``n`` sims started at once (their start-up overlaps), each answering /health with ``health``."""
        started = [self.spawn_sim("m", "--prefill-tps", "200000", *extra) for _ in range(n)]
        for proc, url in started:
            proc.wait_http(url + "/health", timeout=30, expect=lambda status, _: status == health)
        return [url for _, url in started]

    def router(self, endpoints: list[tuple[str, str]], *, routing: str | None = None,
               engine: str = "") -> tuple[str, Proc]:
        entry: dict[str, Any] = {"name": "m", "state": "Ready", "engine": engine,
                                 "endpoints": [{"replica_id": r, "url": u} for r, u in endpoints]}
        if routing is not None:
            entry["routing"] = routing
        url = self.spawn_router(table={"version": 1, "models": [entry]})
        return url, self.procs[-1]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def served_by(http: httpx.Client, router: str, body: dict[str, Any]) -> str:
    response = http.post(router + "/v1/chat/completions" if "messages" in body else router + "/v1/completions",
                         json={"model": "m", "max_tokens": 2, **body})
    assert response.status_code == 200, response.text
    return response.headers["x-llmgw-upstream"]


SYSTEM = {"a": "You answer questions about invoices, politely and in full sentences. " * 50,
          "b": "Réponds en français, en une phrase, sans jamais inventer de chiffres. " * 50}


def test_requests_sharing_a_system_prompt_stick_to_one_replica(cluster: Cluster) -> None:
    """Two groups of chats, each with its own long system prompt, land on one replica per group (the default)."""
    urls = cluster.sims(3)
    router, _ = cluster.router([(f"r{i}", u) for i, u in enumerate(urls)])  # no routing field: prefix_cache
    seen: dict[str, set[str]] = {"a": set(), "b": set()}
    with httpx.Client(timeout=30) as http:
        for i in range(8):
            for group in ("a", "b"):
                messages = [{"role": "system", "content": SYSTEM[group]},
                            {"role": "user", "content": f"question {i} of group {group}"}]
                seen[group].add(served_by(http, router, {"messages": messages}))
    assert len(seen["a"]) == 1 and len(seen["b"]) == 1, seen
    assert seen["a"] != seen["b"]  # the second group went to the least loaded, not onto the first


def test_least_outstanding_steers_around_a_slow_replica(cluster: Cluster) -> None:
    """With a stream held open on a slow engine, new requests all go to the other one."""
    slow, = cluster.sims(1, "--decode-tps", "2")
    fast, = cluster.sims(1, "--decode-tps", "2000")
    router, _ = cluster.router([("r-slow", slow), ("r-fast", fast)], routing="least_outstanding")
    with httpx.Client(timeout=30) as http, contextlib.ExitStack() as held:
        # Ties go round-robin, so within two streams one lands on the slow engine and stays open.
        for _ in range(2):
            stream = held.enter_context(http.stream("POST", router + "/v1/completions", json={
                "model": "m", "prompt": "x", "max_tokens": 500, "stream": True}))
            assert stream.status_code == 200
            if stream.headers["x-llmgw-upstream"] == "r-slow":
                break
        wait_for(lambda: httpx.get(slow + "/sim/stats").json()["running"] >= 1, timeout=5,
                 what="a stream generating on the slow engine")
        served = [served_by(http, router, {"prompt": f"q{i}"}) for i in range(8)]
    assert served == ["r-fast"] * 8


def test_failing_endpoints_are_ejected_and_requests_keep_succeeding(cluster: Cluster) -> None:
    """An endpoint refusing connections and one answering 503 are ejected once each; no request fails."""
    good, = cluster.sims(1)
    loading, = cluster.sims(1, "--startup-delay", "120", health=503)  # answers 503 to every completion
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router, proc = cluster.router([("r-dead", dead), ("r-loading", loading), ("r-good", good)],
                                  routing="round_robin")
    with httpx.Client(timeout=30) as http:
        served = [served_by(http, router, {"prompt": f"q{i}"}) for i in range(15)]
    assert served == ["r-good"] * 15
    log = proc.log_tail(200)
    ejections = [line for line in log.splitlines() if "ejected" in line]
    assert len([line for line in ejections if "r-dead" in line]) == 1, log
    assert len([line for line in ejections if "r-loading" in line and "HTTP 503" in line]) == 1, log
    stats = httpx.get(good + "/sim/stats").json()
    assert stats["completed"] == 15


# --- the Forwarder in process: timeouts, in-flight counts, scraping ------------------------------


async def _serve(handlers: dict[str, Any]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for path, handler in handlers.items():
        app.router.add_route("*", path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _forwarder_checks() -> None:
    release = asyncio.Event()  # set at the end, so the servers' cleanup need not wait on held handlers

    async def silent(request: web.Request) -> web.Response:
        await release.wait()  # never answers in time
        return web.Response()

    async def streaming(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        await release.wait()  # held open until the client goes
        return response

    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async def metrics_text(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == "Bearer k"
        return web.Response(text="llmgw_sim_requests_waiting 4\nllmgw_sim_requests_running 1\n")

    slow_runner, slow = await _serve({"/v1/completions": silent})
    busy_runner, busy_url = await _serve({"/v1/completions": busy})
    good_runner, good = await _serve({"/v1/completions": streaming, "/metrics": metrics_text})
    route = table.ModelRoute(name="m", served_name="m", routing="round_robin", endpoints=(
        table.Endpoint("r-silent", slow), table.Endpoint("r-busy", busy_url),
        table.Endpoint("r-good", good, api_key="k")))
    holder = table.TableHolder(table.RouteTable(version=1, models=(route,)))
    forwarder = upstream.Forwarder(first_byte_timeout_s=0.3, holder=holder, scrape_interval_s=0.1)
    await forwarder.start()
    try:
        endpoint, response = await forwarder.open(route, "/v1/completions", b'{"model":"m"}')
        # The silent one timed out before any byte and the busy one answered 503: both retried,
        # and neither still counts a request in flight.
        assert endpoint.replica_id == "r-good"
        assert forwarder.loads.in_flight == {"r-good": 1}
        assert await response.content.readany() == b"data: {}\n\n"
        response.body_started()
        response.close()  # what the app does when the client leaves
        assert forwarder.loads.in_flight == {}
        # The scrape follows the table: r-good's queue of 4 is its load now; r-silent times out.
        await _until(lambda: forwarder.loads.load("r-good") == 4)
        holder.swap(table.RouteTable(version=2, models=(dataclasses.replace(route, endpoints=route.endpoints[:2]),)))
        await _until(lambda: "r-good" not in forwarder.loads.engine)
    finally:
        await forwarder.close()
        release.set()
        await slow_runner.cleanup()
        await busy_runner.cleanup()
        await good_runner.cleanup()


async def _until(predicate: Any, *, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not reached")


def test_forwarder_times_out_first_byte_counts_in_flight_and_scrapes() -> None:
    """No header within the first-byte timeout retries elsewhere; a stream is in flight until closed;
    engine queues are scraped with the endpoint's key and forgotten when the endpoint leaves the table."""
    asyncio.run(_forwarder_checks())


async def _burst(router: str, asks: list[tuple[str, str, float]]) -> None:
    """Streamed chats at once: (user, system prompt, delay before sending) each, read to the end."""
    async with httpx.AsyncClient(timeout=60) as http:
        async def ask(user: str, prompt: str, delay: float) -> None:
            await asyncio.sleep(delay)
            async with http.stream("POST", router + "/v1/chat/completions", json={
                    "model": "m", "stream": True, "max_tokens": 2, "user": user,
                    "messages": [{"role": "system", "content": prompt},
                                 {"role": "user", "content": f"question of {user}"}]}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    pass

        await asyncio.gather(*(ask(*a) for a in asks))


def test_a_burst_sharing_a_prefix_reaches_the_engine_after_the_first_ones_prefill(cluster: Cluster) -> None:
    """Followers of a prompt still in its prefill wait for its first token; an unrelated prompt does not wait.

    The sim's prefill takes prompt_tokens / prefill_tps (~1.5 s here); it records when each
    request arrived and when its first token went out, on the one monotonic clock of this machine.
    """
    [sim] = cluster.sims(1, "--prefill-tps", "1000")
    router, _ = cluster.router([("r1", sim)], routing="prefix_cache")
    system = "You are a careful assistant. " * 200  # ~6,000 characters: 23 blocks, ~1,500 tokens

    asyncio.run(_burst(router, [("leader", system, 0.0),
                                *((f"follower-{i}", system, 0.2) for i in range(3)),
                                ("stranger", "Something else entirely. " * 200, 0.2)]))
    stats = httpx.get(sim + "/sim/stats").json()
    seen = {a["user"]: a for a in stats["arrivals"]}
    leader = seen["leader"]
    assert leader["first"] is not None
    for i in range(3):
        assert seen[f"follower-{i}"]["arrived"] >= leader["first"], (seen[f"follower-{i}"], leader)
    # A prompt that shares nothing is sent at once, during the leader's prefill.
    assert seen["stranger"]["arrived"] < leader["first"], (seen["stranger"], leader)
    metrics = httpx.get(router + "/metrics").text
    waits = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith("llmgw_router_prefill_waits_total{"))
    assert waits == 3, metrics


def test_on_llamacpp_a_burst_sharing_a_prefix_is_not_held_back(cluster: Cluster) -> None:
    """On an engine whose cached prefix serves one request at a time, followers go at once.

    Waiting would hand them the leader's copy of the prefix, taken from the leader's
    conversation (``prefix.exclusive_prefix``). The sim stands in for llama.cpp: the
    table says engine llamacpp; the same burst as above reaches it during the leader's prefill.
    """
    [sim] = cluster.sims(1, "--prefill-tps", "1000")
    router, _ = cluster.router([("r1", sim)], routing="prefix_cache", engine="llamacpp")
    system = "You are a careful assistant. " * 200

    asyncio.run(_burst(router, [("leader", system, 0.0), *((f"follower-{i}", system, 0.2) for i in range(3))]))
    seen = {a["user"]: a for a in httpx.get(sim + "/sim/stats").json()["arrivals"]}
    for i in range(3):
        assert seen[f"follower-{i}"]["arrived"] < seen["leader"]["first"], (seen[f"follower-{i}"], seen["leader"])
    assert "llmgw_router_prefill_waits_total{" not in httpx.get(router + "/metrics").text
