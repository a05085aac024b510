"""A ``--workers`` hub relays its workers' GET of a kv_aware model's tokenizer files (``router.hub``).

The hub and the control plane it relays to are real aiohttp servers on 127.0.0.1; the worker is the real
``ControlCalls.tokenizer`` a worker's router uses. Over a static table there is no control plane: refused.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from llmgw.router import hub, tokenizers, usagehttp
from llmgw.testing.aioserve import serving

SECRET = "s3cret-of-the-hub"
WORKER = {"Authorization": f"Bearer {SECRET}"}
FILES = tokenizers.TokenizerFiles("hf://org/tiny", b'{"model": {}}', b'{"bos_token": "<s>"}', "{{ messages }}")


def test_the_hub_relays_a_workers_tokenizer_fetch_with_its_credential() -> None:
    seen: list[tuple[str, str]] = []

    async def control_plane(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization", "")))
        if request.match_info["model"] == "m":
            return web.json_response(FILES.to_doc())
        return web.json_response({"error": {"message": "model 'x' offers no tokenizer to routers"}}, status=404)

    async def scenario() -> None:
        cp = web.Application()
        cp.router.add_get(hub.TOKENIZER_PATH + "{model}", control_plane)
        async with serving(cp) as cp_url:
            relay = hub.Relay(lambda: cp_url, headers={"Authorization": "Bearer the-routers-token"})
            await relay.start()
            try:
                async with serving(hub.app(SECRET, hub.Feed(), relay)) as url:
                    calls = usagehttp.ControlCalls(url, headers=WORKER)
                    try:
                        assert await calls.tokenizer("m") == FILES
                        with pytest.raises(usagehttp.CallFailed, match="HTTP 404.*offers no tokenizer"):
                            await calls.tokenizer("x")
                    finally:
                        await calls.stop()
            finally:
                await relay.stop()
        async with serving(hub.app(SECRET, hub.Feed(), hub.LocalLedger({}))) as url:
            calls = usagehttp.ControlCalls(url, headers=WORKER)
            try:
                with pytest.raises(usagehttp.CallFailed, match="HTTP 404.*table file"):
                    await calls.tokenizer("m")
            finally:
                await calls.stop()

    asyncio.run(scenario())
    assert seen == [("/api/v1/router/tokenizer/m", "Bearer the-routers-token"),
                    ("/api/v1/router/tokenizer/x", "Bearer the-routers-token")]
