"""An engine that serves Anthropic's Messages API itself (vLLM) gets /v1/messages passed through, not translated.

The upstream is ``NativeEngine``, an aiohttp server written here that answers ``/v1/messages`` and
``/v1/messages/count_tokens`` as vLLM 0.32 does (``vllm/entrypoints/anthropic``: a Message, its event stream,
``{"input_tokens": N}``, Anthropic-shaped errors) and records what it received; the table names its engine
``vllm``, whose record says it serves the Messages API (``core.engines``' ``anthropic_messages``). The client is
the real ``anthropic`` SDK through a real router process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from aiohttp import web

from llmgw.testing import anthropic_schema
from llmgw.testing.routed import started
from llmgw.testing.threaded import ThreadedApp

MESSAGE = {"id": "msg_native", "type": "message", "role": "assistant", "model": "served-m",
           "content": [{"type": "text", "text": "native answer"}], "stop_reason": "end_turn", "stop_sequence": None,
           "usage": {"input_tokens": 7, "output_tokens": 2}}
EVENTS = [
    ("message_start", {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None,
                                                            "usage": {"input_tokens": 7, "output_tokens": 0}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "native answer"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                       "usage": {"input_tokens": 7, "output_tokens": 2}}),
    ("message_stop", {"type": "message_stop"}),
]


class NativeEngine(ThreadedApp):
    def __init__(self) -> None:
        super().__init__()
        self.received: list[tuple[str, bytes]] = []

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append((request.path, body))
        doc = json.loads(body)
        if "max_tokens" not in doc and request.path == "/v1/messages":
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": "max_tokens: Field required"}}, status=400)
        if request.path.endswith("/count_tokens"):
            return web.json_response({"input_tokens": 7})
        if not doc.get("stream"):
            return web.json_response(MESSAGE)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for name, data in EVENTS:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        await response.write_eof()
        return response

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._messages)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, NativeEngine]]:
    tmp: Path = tmp_path_factory.mktemp("native")
    with NativeEngine() as engine, started(tmp) as p:
        router = p.spawn_router(table={"version": 1, "models": [
            {"name": "m", "served_name": "served-m", "engine": "vllm", "state": "Ready",
             "endpoints": [{"replica_id": "r-1", "url": engine.url, "api_key": ""}]}]})
        yield router, engine


def test_messages_pass_through_to_a_native_engine(native: tuple[str, NativeEngine]) -> None:
    """The body reaches the engine's /v1/messages as the client sent it but for the served name; the answer back."""
    router, engine = native
    client = anthropic.Anthropic(base_url=router, api_key="unused", max_retries=0)
    m = client.messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}],
                               stop_sequences=["x"])
    assert m.content[0].text == "native answer" and m.usage.input_tokens == 7  # type: ignore[union-attr]
    path, body = engine.received[-1]
    assert path == "/v1/messages"
    assert json.loads(body) == {"model": "served-m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
                                "stop_sequences": ["x"]}  # Anthropic's fields, not a chat completion's
    with client.messages.stream(model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == "native answer"
    raw = httpx.post(router + "/v1/messages", json={"model": "m", "max_tokens": 9, "stream": True,
                                                    "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert [n for n, _ in anthropic_schema.validate_stream(raw.content)] == [n for n, _ in EVENTS]
    assert client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}]).input_tokens == 7
    assert engine.received[-1][0] == "/v1/messages/count_tokens"


def test_a_native_engines_refusal_stays_anthropic_shaped(native: tuple[str, NativeEngine]) -> None:
    router, engine = native
    r = httpx.post(router + "/v1/messages", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    assert r.status_code == 400, r.text
    anthropic_schema.validate("error", r.json())
    assert r.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in r.json()["error"]["message"]
