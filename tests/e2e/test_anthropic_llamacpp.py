"""Anthropic's Messages API through the router to a real llama.cpp engine serving SmolLM2-135M.

llama.cpp speaks only OpenAI's chat completions, so the router translates both ways; the real ``anthropic``
SDK is the client, and every answer and stream event is validated against the schemas made from its types.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from llmgw.testing import anthropic_schema
from llmgw.testing.models import smollm2_gguf
from llmgw.testing.procs import Proc, free_port
from llmgw.testing.routed import started

ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("anthropic-llamacpp")
    with started(tmp) as p:
        port = free_port()
        engine = f"http://127.0.0.1:{port}"
        p.procs.append(Proc.start(
            [sys.executable, "-m", "llmgw.agent.engines.llamacpp_launcher", "--model", str(smollm2_gguf()),
             "--port", str(port), "--alias", "smol", "--threads", "2", "--parallel", "1", "--ctx-size", "2048"],
            log_path=tmp / "engine.log"))
        p.procs[-1].wait_http(engine + "/health", timeout=120)
        yield p.router([{"name": "smollm2", "served_name": "smol", "state": "Ready", "engine": "llamacpp",
                         "endpoints": [{"replica_id": "r-1", "url": engine}]}])


def test_plain_and_streamed_messages_from_llamacpp(router: str) -> None:
    client = anthropic.Anthropic(base_url=router, api_key="unused", max_retries=0)
    m = client.messages.create(model="smollm2", max_tokens=12, system="You are terse.", messages=ASK)
    assert m.model == "smollm2" and m.content and m.content[0].type == "text" and m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0
    assert 0 < m.usage.output_tokens <= 12
    with client.messages.stream(model="smollm2", max_tokens=12, messages=ASK) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.strip() and final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.input_tokens > 0 and 0 < final.usage.output_tokens <= 12
    raw = httpx.post(router + "/v1/messages", json={"model": "smollm2", "max_tokens": 5, "messages": ASK}, timeout=60)
    anthropic_schema.validate("message", raw.json())
    assert raw.json()["stop_reason"] == "max_tokens" and raw.json()["usage"]["output_tokens"] == 5
    streamed = httpx.post(router + "/v1/messages", json={"model": "smollm2", "max_tokens": 5, "stream": True,
                                                         "messages": ASK}, timeout=60)
    found = anthropic_schema.validate_stream(streamed.content)
    delta = dict(found)["message_delta"]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 5
    assert delta["usage"]["input_tokens"] + delta["usage"]["cache_read_input_tokens"] == (
        client.messages.count_tokens(model="smollm2", messages=ASK).input_tokens)
