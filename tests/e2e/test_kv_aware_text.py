"""``kv_aware`` scores text requests through the real router: its tokenizer, fetched once, gives the prompt's ids.

Two sim engines behind the router's own app and HTTP server; the real ``openai`` client sends a chat and a
text completion. The replicas' block sets are fed into the router's KV view the way the other ``kv_aware``
tests feed them (the link that brings them from the agents is another part), computed from the ids vLLM's
own tokenizer gave for the same request (``tests/fixtures/kvtok/cases.json``, not the router's tokenizer).
Which replica served says who scored: after the first answer ``prefix_cache`` (the fallback) would keep the
prompt where it sent it, while ``kv_aware`` follows the block sets when they move to the other replica.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import openai
from aiohttp import web

from llmgw.core import kvhash
from llmgw.router import app as app_mod
from llmgw.router import server, table, tokenizers
from llmgw.router.kvview import ReplicaCache
from llmgw.sim.engine.app import Config, SimEngine
from llmgw.testing.procs import free_port

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures/kvtok"
CASES = {v["name"]: v for v in json.loads((FIXTURES / "cases.json").read_text())["variants"]}
TINY = CASES["tiny"]
BLOCK = 4  # the tiny tokenizer's prompts are short: small blocks give each several


def _blocks(ids: list[int]) -> frozenset[int | bytes]:
    return frozenset(kvhash.external(h) for h in kvhash.block_hashes(ids, BLOCK))


def _table(sims: list[str], version: str) -> table.RouteTable:
    return table.RouteTable.from_doc({"version": 1, "models": [{
        "name": "m", "state": "Ready", "routing": "kv_aware", "engine": "vllm", "tokenizer": version,
        "endpoints": [{"replica_id": f"r{i}", "url": u} for i, u in enumerate(sims)]}]})


async def _scenario() -> None:
    fetched: list[str] = []

    async def fetch(model: str) -> tokenizers.TokenizerFiles:
        fetched.append(model)
        return tokenizers.TokenizerFiles("hf://t/tiny@1", (FIXTURES / TINY["tokenizer"]).read_bytes(),
                                         json.dumps(TINY["tokenizer_config"]).encode(), TINY["chat_template"])

    runners, sims = [], []
    for _ in range(2):
        port = free_port()
        runner = web.AppRunner(SimEngine(Config(model="m", decode_tps=5000, prefill_tps=10**6)).app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        sims.append(f"http://127.0.0.1:{port}")
    holder = table.TableHolder()
    holder.swap(_table(sims, "hf://t/tiny@1"))
    router = app_mod.RouterApp(holder, tokenizer_fetch=fetch)
    await router.startup()
    http, port = server.Server(router), free_port()
    await http.start("127.0.0.1", port)
    view = router._forwarder.policies["kv_aware"].view  # type: ignore[attr-defined]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    try:
        chat = TINY["chats"][1]  # system, user, assistant, user
        text = next(c for c in TINY["completions"] if len(c["ids"]) >= 3 * BLOCK and c["add_special_tokens"])

        async def served(kind: str) -> str:
            if kind == "chat":
                raw: Any = await client.chat.completions.with_raw_response.create(
                    model="m", messages=chat["messages"], max_tokens=2)
            else:
                raw = await client.completions.with_raw_response.create(model="m", prompt=text["prompt"], max_tokens=2)
            return str(raw.headers["x-llmgw-upstream"])

        def hold(holder_id: str) -> None:
            other = "r0" if holder_id == "r1" else "r1"
            view.update(holder_id, ReplicaCache(_blocks(chat["ids"]) | _blocks(text["ids"]), BLOCK))
            view.update(other, ReplicaCache(_blocks([7, 7, 7, 7, 7, 7, 7, 7]), BLOCK))

        hold("r1")
        await served("chat")  # the first kv_aware request starts the tokenizer's load, and falls back meanwhile
        await router.tokenizers.wait()
        assert fetched == ["m"]
        for kind in ("chat", "text", "chat", "text"):
            assert await served(kind) == "r1", kind
        hold("r0")  # the blocks move: prefix_cache would stay on r1, where it sent these prompts
        for kind in ("chat", "text", "chat", "text"):
            assert await served(kind) == "r0", kind
        assert fetched == ["m"]  # fetched once per model and version
        holder.swap(_table(sims, "hf://t/tiny@2"))  # a new version of the files: fetched again
        await served("chat")
        await router.tokenizers.wait()
        assert fetched == ["m", "m"]
    finally:
        await client.close()
        await http.shutdown(1)
        await router.shutdown()
        for runner in runners:
            await runner.cleanup()


def test_a_text_chat_and_completion_are_scored_by_kv_aware_through_the_router() -> None:
    asyncio.run(asyncio.wait_for(_scenario(), 60))
