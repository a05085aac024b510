"""The router metering and enforcing budgets end to end: the real router app on its own HTTP server, the sim engine,
OpenAI's client, and the sim ledger (``sim.ledger``) as the control plane's budget and usage services.

Every answered request is one stored usage record equal to the engine's usage; a stream whose client did not ask
for usage gets none, one that asked gets it; the key's requests_per_day holds, each refusal a 429 naming the budget
with Retry-After and the x-ratelimit headers, which every answer (and /v1/models) carries. No timed assertion.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
from aiohttp import web

from llmgw.router import app as app_mod
from llmgw.router import server, table
from llmgw.sim.engine.app import Config, SimEngine
from llmgw.sim.ledger import SimLedger
from llmgw.testing.procs import free_port

SECRET = "sk-metering-test"
LIMIT = 8


def _table(sim: str) -> table.RouteTable:
    return table.RouteTable.from_doc({
        "version": 1,
        "models": [{"name": "m", "state": "Ready", "pricing": {"input_per_1m": 1.0, "output_per_1m": 3.0},
                    "endpoints": [{"replica_id": "m-1", "url": sim, "node": "node-a"}]}],
        "auth": {"required": True,
                 "keys": [{"id": "k1", "sha256": hashlib.sha256(SECRET.encode()).hexdigest(), "project": "team-a",
                           "user": "ann", "limits": {"requests_per_day": LIMIT}}],
                 "projects": [{"name": "team-a", "limits": {"tokens_per_day": 1_000_000}}]}})


class Cluster:
    def __init__(self, router: str, ledger: SimLedger, app: app_mod.RouterApp) -> None:
        self.router, self.ledger, self.app = router, ledger, app


async def _cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    sim_port, router_port = free_port(), free_port()
    runner = web.AppRunner(SimEngine(Config(model="m", decode_tps=2000, prefill_tps=10**6)).app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", sim_port).start()
    ledger = SimLedger({("key:k1", "requests_per_day"): LIMIT, ("project:team-a", "tokens_per_day"): 1_000_000})
    holder = table.TableHolder()
    holder.swap(_table(f"http://127.0.0.1:{sim_port}"))
    router = app_mod.RouterApp(holder, quota=ledger.sync, usage=ledger.ingest, usage_journal_dir=tmp_path / "j",
                               router_id="r1")
    await router.startup()
    http = server.Server(router)
    await http.start("127.0.0.1", router_port)
    try:
        yield Cluster(f"http://127.0.0.1:{router_port}", ledger, router)
    finally:
        await http.shutdown(1)
        await router.shutdown()
        await runner.cleanup()


def run(tmp_path: Path, test: Any) -> None:
    async def main() -> None:
        async for cluster in _cluster(tmp_path):
            await test(cluster)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_usage_is_metered_exactly_and_the_budget_holds(tmp_path: Path) -> None:
    async def test(c: Cluster) -> None:
        client = openai.AsyncOpenAI(base_url=c.router + "/v1", api_key=SECRET, max_retries=0)
        engine: list[tuple[int, int]] = []  # the engine's usage of each served request
        messages = [{"role": "user", "content": "count to ten, please " * 4}]
        whole = await client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=5)
        assert whole.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        assert int(whole.headers["x-ratelimit-remaining-requests"]) < LIMIT
        assert whole.headers["x-ratelimit-limit-tokens"] == "1000000"
        done = whole.parse()
        assert done.usage is not None
        engine.append((done.usage.prompt_tokens, done.usage.completion_tokens))
        # A stream whose client did not ask for usage: none reaches it; the router metered it anyway.
        chunks = [c async for c in await client.chat.completions.create(model="m", messages=messages, max_tokens=6,
                                                                         stream=True)]
        assert all(ch.usage is None for ch in chunks) and all(ch.choices for ch in chunks)
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks).count("tok") == 6
        engine.append((done.usage.prompt_tokens, 6))
        # One that asked gets the engine's last chunk with its usage, as OpenAI sends it.
        asked = [c async for c in await client.chat.completions.create(
            model="m", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True})]
        assert asked[-1].choices == [] and asked[-1].usage is not None
        engine.append((asked[-1].usage.prompt_tokens, asked[-1].usage.completion_tokens))
        for _ in range(LIMIT - 3):
            r = await client.completions.create(model="m", prompt="hello there", max_tokens=3)
            assert r.usage is not None
            engine.append((r.usage.prompt_tokens, r.usage.completion_tokens))
        async with httpx.AsyncClient() as raw:
            refused = await raw.post(c.router + "/v1/completions", headers={"Authorization": f"Bearer {SECRET}"},
                                     json={"model": "m", "prompt": "one more", "max_tokens": 3})
            models = await raw.get(c.router + "/v1/models", headers={"Authorization": f"Bearer {SECRET}"})
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "budget_exceeded"
        assert "API key k1's requests_per_day" in error["message"] and f"limit {LIMIT}" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert models.status_code == 200 and models.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        assert c.app.journal is not None
        await c.app.journal.flush()
        records = sorted(c.ledger.records, key=lambda r: r.seq)
        assert [(r.prompt_tokens, r.completion_tokens) for r in records] == engine
        assert {(r.project, r.key, r.user, r.model, r.node, r.replica, r.status) for r in records} == \
            {("team-a", "k1", "ann", "m", "node-a", "m-1", 200)}
        # The same prompt again: the sim reports its blocks cached, priced at cached input (0 here).
        assert [r.cached_tokens for r in records[:3]] == [0, 16, 16]
        assert [r.spend_micros for r in records] == [p - r.cached_tokens + 3 * n
                                                     for r, (p, n) in zip(records, engine, strict=True)]
        assert [r for r in records if not 0 < r.ttft_ms <= r.duration_ms] == []
        assert c.ledger.charged("key:k1", "requests_per_day") + c.ledger.held("key:k1", "requests_per_day") <= LIMIT

    run(tmp_path, test)


def test_a_client_that_leaves_mid_stream_is_charged_for_what_was_generated(tmp_path: Path) -> None:
    async def test(c: Cluster) -> None:
        # 2000 tokens/s: 400 tokens take 0.2 s; the client leaves after the first event.
        async with httpx.AsyncClient() as raw, raw.stream(
                "POST", c.router + "/v1/completions", headers={"Authorization": f"Bearer {SECRET}"},
                json={"model": "m", "prompt": "x" * 40, "max_tokens": 400, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    assert '"usage"' not in line  # the continuous usage asked for is the router's
                    break
        assert c.app.journal is not None
        for _ in range(200):  # the request ends at the router once the cancel reaches it
            if c.app.journal.pending or c.ledger.records:
                break
            await asyncio.sleep(0.05)
        await c.app.journal.flush()
        record, = c.ledger.records
        assert record.status == 499 and record.prompt_tokens == 10 and 1 <= record.completion_tokens < 400
        assert json.loads(json.dumps(record.to_doc()))["key"] == "k1"

    run(tmp_path, test)


def test_the_standalone_router_s_http_transports_reach_the_control_plane() -> None:
    """``usagehttp.ControlCalls``: QuotaSync and UsageBatch POSTed with the router's credential, answers read back."""
    from llmgw.api import usage as wire
    from llmgw.router import usagehttp

    ledger = SimLedger({("key:k1", "requests_per_day"): 10})
    seen: list[str] = []

    async def quota_route(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        answer = await ledger.sync(wire.QuotaSync.from_doc(await request.json()))
        return web.json_response(answer.to_doc())

    async def usage_route(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        ack = await ledger.ingest(wire.UsageBatch.from_doc(await request.json()))
        return web.json_response(ack.to_doc())

    async def main() -> None:
        control = web.Application()
        control.router.add_post(wire.QUOTA_PATH, quota_route)
        control.router.add_post(wire.USAGE_PATH, usage_route)
        runner = web.AppRunner(control)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        calls = usagehttp.ControlCalls(lambda: f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer rt"})
        try:
            answer = await calls.quota(wire.QuotaSync("r1", (wire.QuotaItem("key:k1/requests_per_day/2026-12-04",
                                                                            want=4),)))
            assert answer.items[0].granted >= 1 and answer.items[0].limit == 10
            record = wire.UsageRecord(1, 1.0, "team-a", "k1", "", "m", "", "m-1", 3, 0, 2, 0, 200, 1.0, 2.0)
            ack = await calls.usage(wire.UsageBatch("r1", "j1", (record,)))
            assert ack == wire.UsageAck("j1", 1) and ledger.records == [record]
        finally:
            await calls.stop()
            await runner.cleanup()
        assert seen == ["Bearer rt", "Bearer rt"]

    asyncio.run(asyncio.wait_for(main(), 30))
