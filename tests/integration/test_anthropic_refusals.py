"""/v1/messages under the router's budgets, metering and admission queue: the same as chat, in Anthropic's shape.

A router app in process with the sim ledger as its quota and usage services (as ``test_router_metering``) in
front of an in-process sim engine: Messages requests are metered with the engine's usage and count against the
key's requests_per_day, whose refusal is a 429 ``rate_limit_error``. The admission queue's refusal (an
``overloaded_error``) is in ``tests/e2e/test_anthropic_overload.py``: three processes take longer to start.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import anthropic
import httpx
from aiohttp import web

from llmgw.router import app as app_mod
from llmgw.router import server, table
from llmgw.sim.engine import Config, SimEngine
from llmgw.sim.ledger import SimLedger
from llmgw.testing import anthropic_schema
from llmgw.testing.procs import free_port

SECRET = "sk-anthropic-budget"
LIMIT = 2


def test_messages_are_metered_and_a_spent_budget_is_a_rate_limit_error(tmp_path: Path) -> None:
    async def main() -> None:
        sim_port, router_port = free_port(), free_port()
        runner = web.AppRunner(SimEngine(Config(model="m", decode_tps=2000, prefill_tps=10**6)).app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", sim_port).start()
        ledger = SimLedger({("key:k1", "requests_per_day"): LIMIT})
        holder = table.TableHolder()
        holder.swap(table.RouteTable.from_doc({
            "version": 1,
            "models": [{"name": "m", "state": "Ready",
                        "endpoints": [{"replica_id": "m-1", "url": f"http://127.0.0.1:{sim_port}", "node": "n"}]}],
            "auth": {"required": True, "keys": [{"id": "k1", "sha256": hashlib.sha256(SECRET.encode()).hexdigest(),
                                                 "limits": {"requests_per_day": LIMIT}}]}}))
        router = app_mod.RouterApp(holder, quota=ledger.sync, usage=ledger.ingest, usage_journal_dir=tmp_path / "j",
                                   router_id="r1")
        await router.startup()
        http = server.Server(router)
        await http.start("127.0.0.1", router_port)
        url = f"http://127.0.0.1:{router_port}"
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key=SECRET, max_retries=0)
            ask = [{"role": "user", "content": "count to ten, please"}]
            whole = await client.messages.create(model="m", max_tokens=5, messages=ask)  # type: ignore[arg-type]
            async with client.messages.stream(model="m", max_tokens=3, messages=ask) as s:  # type: ignore[arg-type]
                streamed = await s.get_final_message()
            async with httpx.AsyncClient() as raw:
                refused = await raw.post(url + "/v1/messages", headers={"x-api-key": SECRET}, json={
                    "model": "m", "max_tokens": 5, "messages": ask})
            assert refused.status_code == 429, refused.text
            anthropic_schema.validate("error", refused.json())
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert "requests_per_day" in refused.json()["error"]["message"]
            assert int(refused.headers["retry-after"]) >= 1
            assert router.journal is not None
            await router.journal.flush()
            records = sorted(ledger.records, key=lambda r: r.seq)
            assert [(r.prompt_tokens, r.completion_tokens, r.key, r.status) for r in records] == [
                (whole.usage.input_tokens, 5, "k1", 200), (streamed.usage.input_tokens, 3, "k1", 200)]
        finally:
            await http.shutdown(1)
            await router.shutdown()
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 60))
