"""The hub of ``llmgw router --workers N`` (``router.hub``): its workers' long poll, the relay, the local ledger.

The hub's API is a real aiohttp server on 127.0.0.1 and so is the control plane it relays to; a "worker"
here is an HTTP client with the hub's secret, or a real ``TableWatcher`` / ``ControlCalls`` as a worker has.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.api import usage as wire
from llmgw.core import quota, skew
from llmgw.router import hub, usagehttp, watch
from llmgw.router.table import TableHolder
from llmgw.testing.aioserve import serving

SECRET = "s3cret-of-the-hub"
WORKER = {"Authorization": f"Bearer {SECRET}"}
WAIT_S = 10.0


def table(model: str, *, version: int = 7, keys: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": version, "models": [
        {"name": model, "state": "Ready", "endpoints": [{"replica_id": f"{model}-1", "url": "http://127.0.0.1:9"}]}]}
    if keys is not None:
        doc["auth"] = {"required": True, "keys": keys}
    return doc


async def until(test: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not test():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S:g} s"
        await asyncio.sleep(0.02)


async def nothing(path: str, body: bytes) -> web.Response:
    return web.json_response({})


def test_the_long_poll_answers_a_new_version_at_once_holds_an_unchanged_one_and_times_out() -> None:
    async def scenario() -> None:
        feed = hub.Feed()
        async with serving(hub.app(SECRET, feed, nothing)) as url, aiohttp.ClientSession() as http:
            async def poll(after: int, timeout: float) -> tuple[int, dict[str, Any], float]:
                t0 = time.monotonic()
                async with http.get(url + "/api/v1/endpoints", params={"after": str(after), "timeout": str(timeout)},
                                    headers=WORKER) as resp:
                    return resp.status, await resp.json(), time.monotonic() - t0

            status, doc, _ = await poll(-1, 0.2)
            assert status == 503  # nothing received yet: held the timeout, then "no table"
            assert feed.publish(table("a", version=41))
            status, doc, took = await poll(-1, 30)
            assert status == 200 and doc["version"] == 1 and doc["models"][0]["name"] == "a" and took < 5
            status, doc, took = await poll(1, 0.3)  # unchanged: held, then the same table
            assert status == 200 and doc["version"] == 1 and 0.25 <= took < 5
            held = asyncio.create_task(poll(1, 30))
            await asyncio.sleep(0.2)
            assert not held.done()
            # The same table under another upstream version (a failover): no change for the workers.
            assert not feed.publish(table("a", version=3))
            await asyncio.sleep(0.2)
            assert not held.done()
            assert feed.publish(table("b", version=3))
            status, doc, took = await asyncio.wait_for(held, WAIT_S)
            assert status == 200 and doc["version"] == 2 and doc["models"][0]["name"] == "b"

    asyncio.run(scenario())


@pytest.mark.parametrize("given", [None, "Bearer wrong", f"Basic {SECRET}"])
def test_only_the_workers_secret_opens_the_hub(given: str | None) -> None:
    got: list[str] = []

    async def recorded(path: str, body: bytes) -> web.Response:
        got.append(path)
        return web.json_response({})

    async def scenario() -> None:
        feed = hub.Feed()
        feed.publish(table("a"))
        async with serving(hub.app(SECRET, feed, recorded)) as url, aiohttp.ClientSession() as http:
            headers = {"Authorization": given} if given else {}
            async with http.get(url + "/api/v1/endpoints", headers=headers) as resp:
                assert resp.status == 401
            async with http.post(url + wire.USAGE_PATH, json={}, headers=headers) as resp:
                assert resp.status == 401

    asyncio.run(scenario())
    assert got == []


def test_a_workers_post_reaches_the_control_plane_with_the_hubs_credential_and_its_answer_comes_back() -> None:
    seen: list[tuple[str, str, Any]] = []

    async def control_plane(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization", ""), await request.json()))
        if request.path == wire.QUOTA_PATH:
            return web.json_response({"error": "store unavailable"}, status=503)
        return web.json_response({"journal": "j1", "applied_through": 4})

    async def scenario() -> None:
        cp = web.Application()
        for path in hub.RELAYED:
            cp.router.add_post(path, control_plane)
        async with serving(cp) as cp_url:
            relay = hub.Relay(lambda: cp_url, headers={"Authorization": "Bearer the-routers-token"})
            await relay.start()
            try:
                async with serving(hub.app(SECRET, hub.Feed(), relay)) as url:
                    calls = usagehttp.ControlCalls(url, headers=WORKER)  # a worker's own transports
                    try:
                        batch = wire.UsageBatch("r.w0", "j1", ())
                        assert await calls.usage(batch) == wire.UsageAck("j1", 4)
                        with pytest.raises(usagehttp.CallFailed, match="HTTP 503"):
                            await calls.quota(wire.QuotaSync("r.w0", ()))
                    finally:
                        await calls.stop()
                    async with aiohttp.ClientSession() as http:
                        async with http.post(url + "/api/v1/router/signals", json={"router": "r.w1"},
                                             headers=WORKER) as resp:
                            assert resp.status == 200
            finally:
                await relay.stop()
        # The control plane gone: a 502 the worker's own failure path takes (journal resends, budgets fail closed).
        relay = hub.Relay(lambda: cp_url, headers={})
        await relay.start()
        try:
            async with serving(hub.app(SECRET, hub.Feed(), relay)) as url, aiohttp.ClientSession() as http:
                async with http.post(url + wire.USAGE_PATH, json={}, headers=WORKER) as resp:
                    assert resp.status == 502
        finally:
            await relay.stop()

    asyncio.run(scenario())
    assert [(p, a) for p, a, _ in seen] == [(wire.USAGE_PATH, "Bearer the-routers-token"),
                                          (wire.QUOTA_PATH, "Bearer the-routers-token"),
                                          ("/api/v1/router/signals", "Bearer the-routers-token")]
    assert seen[0][2]["router"] == "r.w0" and seen[2][2] == {"router": "r.w1"}


def test_one_subscription_upstream_fans_out_to_every_worker() -> None:
    """The hub follows a control plane; two workers' real watchers follow the hub and get each new table."""
    polls: list[int] = []
    current = {"doc": table("a", version=5)}
    changed = asyncio.Event()

    async def endpoints(request: web.Request) -> web.Response:
        polls.append(int(request.query["after"]))
        assert request.headers["Authorization"] == "Bearer the-routers-token"
        if int(request.query["after"]) == current["doc"]["version"]:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), float(request.query["timeout"]))
        return web.json_response(current["doc"], headers=skew.headers())

    async def scenario() -> None:
        cp = web.Application()
        cp.router.add_get("/api/v1/endpoints", endpoints)
        async with serving(cp) as cp_url:
            feed = hub.Feed()
            upstream = hub.Upstream((cp_url,), feed, headers={"Authorization": "Bearer the-routers-token"})
            await upstream.start()
            holders = [TableHolder(), TableHolder()]
            try:
                async with serving(hub.app(SECRET, feed, nothing)) as url:
                    watchers = [watch.TableWatcher(url, h, headers=WORKER) for h in holders]
                    for w in watchers:
                        await w.start()
                    try:
                        await until(lambda: all(h.current.lookup("a") for h in holders), "both workers have v1")
                        current["doc"] = table("b", version=6)
                        changed.set()
                        await until(lambda: all(h.current.lookup("b") for h in holders), "both workers have v2")
                        assert [h.current.version for h in holders] == [2, 2]
                    finally:
                        for w in watchers:
                            await w.stop()
            finally:
                await upstream.stop()

    asyncio.run(scenario())
    assert polls[:2] == [-1, 5]  # one subscription: the workers' polls never reach the control plane


def test_over_a_static_table_the_hub_grants_a_keys_rpm_across_workers_exactly() -> None:
    """Two workers ask the hub's ledger for all they can get of a 50-request minute: 50 in all, never more."""
    doc = table("m", keys=[{"id": "k1", "sha256": "0" * 64, "rpm": 50, "tpm": 0},
                           {"id": "k2", "sha256": "1" * 64, "limits": {"requests_per_day": 7, "tokens_per_day": 900}},
                           {"id": "k3", "sha256": "2" * 64}])
    limits = hub.table_limits(doc)
    assert limits == {("key:k1", "requests_per_minute"): 50, ("key:k2", "requests_per_day"): 7,
                      ("key:k2", "tokens_per_day"): 900}

    async def scenario() -> int:
        bid = quota.budget_id("key:k1", "requests_per_minute", quota.period("requests_per_minute", time.time()).id)
        ledger = hub.LocalLedger(limits)
        async with serving(hub.app(SECRET, hub.Feed(), ledger)) as url:
            workers = [usagehttp.ControlCalls(url, headers=WORKER) for _ in range(2)]
            got = 0
            try:
                for _ in range(40):
                    for i, calls in enumerate(workers):
                        answer = await calls.quota(wire.QuotaSync(f"r.w{i}", (wire.QuotaItem(bid, want=30),)))
                        got += answer.items[0].granted
                ack = await workers[0].usage(wire.UsageBatch("r.w0", "j", ()))
                assert ack == wire.UsageAck("j", 0)
            finally:
                for calls in workers:
                    await calls.stop()
        return got

    assert asyncio.run(scenario()) == 50


def test_the_hub_holds_the_port_its_workers_listen_on_beside_it() -> None:
    """Port 0 chooses one and holds it (bound, not listening); a worker's SO_REUSEPORT listener binds beside it,
    and a port another program listens on is refused at the start."""
    held = hub.hold_port("127.0.0.1", 0)
    try:
        port = held.getsockname()[1]
        assert port > 0
        worker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        worker.bind(("127.0.0.1", port))
        worker.listen()
        worker.close()
    finally:
        held.close()
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(OSError):
            hub.hold_port("127.0.0.1", other.getsockname()[1]).close()
    finally:
        other.close()
