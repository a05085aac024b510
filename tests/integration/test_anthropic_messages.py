"""Anthropic's Messages API on the router, driven by the real ``anthropic`` SDK against sim engines.

One router process over a static table (two keys: one open, one at 1 request a minute) in front of a sim
engine started with ``--echo`` (its answer is the last user message or tool result, a word a token), started
once for the module. Every whole answer, error and stream event is validated against the schemas made from the
SDK's own types (``llmgw/testing/anthropic_schema.py``).
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from llmgw.testing import anthropic_schema
from llmgw.testing.routed import Procs, started

KEY = "llmgw-anthropic-test-key"
LIMITED = "llmgw-anthropic-limited-key"
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class Cluster:
    def __init__(self, router: str, sim: str) -> None:
        self.router, self.sim = router, sim
        self.client = anthropic.Anthropic(base_url=router, api_key=KEY, max_retries=0)

    def last_engine_body(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.sim + "/sim/stats", timeout=10) as r:
            return json.loads(r.read())["requests"][-1]  # type: ignore[no-any-return]

    def post(self, path: str, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
        sent = {"x-api-key": KEY, "anthropic-version": "2023-06-01"} if headers is None else headers
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(self.router + path, content=content, headers=sent, timeout=30)


def _key(id_: str, secret: str, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "sha256": hashlib.sha256(secret.encode()).hexdigest(), **extra}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("anthropic")
    with started(tmp) as p:
        assert isinstance(p, Procs)
        sim = p.sim("sim-m", "--echo", "--decode-tps", "2000")
        router = p.spawn_router(table={
            "version": 1,
            "models": [{"name": "m", "served_name": "sim-m", "aliases": ["claude-sonnet-4-5"], "state": "Ready",
                        "endpoints": [{"replica_id": "r-1", "url": sim, "api_key": ""}]}],
            "auth": {"required": True, "keys": [_key("k-open", KEY), _key("k-limited", LIMITED, rpm=1)]}},
            expect=lambda status, _body: status == 401)
        yield Cluster(router, sim)


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_a_plain_message_is_an_anthropic_message(cluster: Cluster) -> None:
    """A plain request: the text, end_turn, the engine's usage, the name the client asked; valid against Message."""
    m = cluster.client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=_ask("hello there friend"))
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "hello there friend"  # type: ignore[union-attr]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None and m.model == "claude-sonnet-4-5"
    assert m.usage.output_tokens == 3 and m.usage.input_tokens >= 1
    raw = cluster.post("/v1/messages", {"model": "m", "max_tokens": 50, "messages": _ask("hello there friend")})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("application/json")
    anthropic_schema.validate("message", raw.json())


def test_a_stream_is_anthropics_event_stream(cluster: Cluster) -> None:
    """Streamed: message_start, ping, one text block's deltas, message_delta with the usage, message_stop."""
    with cluster.client.messages.stream(model="m", max_tokens=50, messages=_ask("one two three four")) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "one two three four" and final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    raw = cluster.post("/v1/messages", {"model": "m", "max_tokens": 50, "stream": True,
                                        "messages": _ask("one two three four")})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = anthropic_schema.validate_stream(raw.content)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    assert names.count("content_block_delta") == 4 and names[-2:] == ["message_delta", "message_stop"]
    delta = dict(events)["message_delta"]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 4 and delta["usage"]["input_tokens"] >= 1


def test_system_prompt_and_turns_reach_the_engine_in_order(cluster: Cluster) -> None:
    """A system prompt (blocks) goes first as role system, then the turns as they were, assistant included."""
    m = cluster.client.messages.create(
        model="m", max_tokens=50, system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[{"role": "user", "content": "first question"}, {"role": "assistant", "content": "first answer"},
                  {"role": "user", "content": [{"type": "text", "text": "second question"}]}],
        metadata={"user_id": "ann"},
        # Sampling fields this SDK's create() no longer names (older SDKs and other clients send them).
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40})
    assert m.content[0].text == "second question"  # type: ignore[union-attr]
    sent = cluster.last_engine_body()
    assert sent["messages"] == [{"role": "system", "content": "Be brief.\n\nBe kind."},
                                {"role": "user", "content": "first question"},
                                {"role": "assistant", "content": "first answer"},
                                {"role": "user", "content": "second question"}]
    assert (sent["model"], sent["max_tokens"], sent["temperature"], sent["top_p"], sent["top_k"], sent["user"]) == (
        "sim-m", 50, 0.5, 0.9, 40, "ann")
    m2 = cluster.client.messages.create(model="m", max_tokens=50, system="plain string", messages=_ask("x y"))
    assert m2.content[0].text == "x y"  # type: ignore[union-attr]
    assert cluster.last_engine_body()["messages"][0] == {"role": "system", "content": "plain string"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_stops_and_is_named(cluster: Cluster, stream: bool) -> None:
    """The text stops before the sequence; stop_reason stop_sequence names which one matched."""
    ask = {"model": "m", "max_tokens": 50, "messages": _ask("alpha beta STOP gamma"),
           "stop_sequences": ["NOPE", "STOP"]}
    if stream:
        with cluster.client.messages.stream(**ask) as s:  # type: ignore[arg-type]
            m = s.get_final_message()
    else:
        m = cluster.client.messages.create(**ask)  # type: ignore[arg-type]
    assert m.content[0].text == "alpha beta "  # type: ignore[union-attr]
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "STOP")
    assert cluster.last_engine_body()["stop"] == ["NOPE", "STOP"]


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_stops_the_answer(cluster: Cluster, stream: bool) -> None:
    ask = {"model": "m", "max_tokens": 2, "messages": _ask("one two three four")}
    if stream:
        with cluster.client.messages.stream(**ask) as s:  # type: ignore[arg-type]
            m = s.get_final_message()
    else:
        m = cluster.client.messages.create(**ask)  # type: ignore[arg-type]
    assert m.content[0].text == "one two" and m.stop_reason == "max_tokens"  # type: ignore[union-attr]
    assert m.usage.output_tokens == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trip(cluster: Cluster, stream: bool) -> None:
    """The model calls the tool (tool_use, its input parsed), the tool's result goes back, the model answers."""
    ask: dict[str, Any] = {"model": "m", "max_tokens": 100, "tools": [WEATHER],
                           "messages": _ask("use get_weather for Paris")}
    if stream:
        raw = cluster.post("/v1/messages", {**ask, "stream": True})
        events = anthropic_schema.validate_stream(raw.content)
        assert any(d.get("delta", {}).get("type") == "input_json_delta" for _, d in events)
        with cluster.client.messages.stream(**ask) as s:
            m = s.get_final_message()
    else:
        m = cluster.client.messages.create(**ask)
    assert m.stop_reason == "tool_use"
    call = m.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "sim"}
    sent = cluster.last_engine_body()
    assert sent["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters":
                                                                WEATHER["input_schema"],
                                                                "description": "The weather in a city."}}]
    turns = [*ask["messages"], {"role": "assistant", "content": [b.model_dump() for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                           "content": "sunny and warm"}]}]
    answer = cluster.client.messages.create(model="m", max_tokens=100, tools=[WEATHER], messages=turns)
    assert answer.stop_reason == "end_turn" and answer.content[0].text == "sunny and warm"  # type: ignore[union-attr]
    sent = cluster.last_engine_body()["messages"]
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == call.id
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "sim"}
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny and warm"}


def test_tool_choice_names_the_tool(cluster: Cluster) -> None:
    m = cluster.client.messages.create(model="m", max_tokens=50, tools=[WEATHER], messages=_ask("anything"),
                                       tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use" and m.content[0].type == "tool_use"
    assert cluster.last_engine_body()["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_count_tokens_is_the_prompts_count(cluster: Cluster) -> None:
    ask: dict[str, Any] = {"model": "m", "messages": _ask("count these words please, all of them")}
    counted = cluster.client.messages.count_tokens(**ask)
    used = cluster.client.messages.create(max_tokens=5, **ask).usage
    assert counted.input_tokens == used.input_tokens + (used.cache_read_input_tokens or 0) > 0
    anthropic_schema.validate("count", cluster.post("/v1/messages/count_tokens", ask).json())


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    anthropic_schema.validate("error", r.json())
    assert r.json()["error"]["type"] == kind, r.text
    return str(r.json()["error"]["message"])


def test_errors_are_anthropic_shaped(cluster: Cluster) -> None:
    """Unknown model 404, a bad body 400 naming the field, a bad key 401: each as the SDK's error class."""
    with pytest.raises(anthropic.NotFoundError) as nf:
        cluster.client.messages.create(model="no-such-model", max_tokens=5, messages=_ask("x"))
    assert nf.value.body["error"]["type"] == "not_found_error" and "no-such-model" in str(nf.value)  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        cluster.client.messages.create(model="m", max_tokens=5, messages=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=cluster.router, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=_ask("x"))
    assert "max_tokens" in _error(cluster.post("/v1/messages", {"model": "m", "messages": _ask("x")}),
                                  400, "invalid_request_error")
    assert "JSON" in _error(cluster.post("/v1/messages", b"{not json"), 400, "invalid_request_error")
    assert "x-api-key" in _error(cluster.post("/v1/messages", {"model": "m", "max_tokens": 5, "messages": _ask("x")},
                                              headers={}), 401, "authentication_error")
    _error(cluster.post("/v1/messages", {"model": "m", "max_tokens": 5, "messages": _ask("x"),
                                         "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
           400, "invalid_request_error")
    assert httpx.get(cluster.router + "/v1/messages", headers={"x-api-key": KEY}).status_code == 405


def test_rate_limit_is_a_rate_limit_error(cluster: Cluster) -> None:
    """The router's own 429 (the key's requests per minute) on /v1/messages: rate_limit_error, Retry-After kept."""
    body = {"model": "m", "max_tokens": 5, "messages": _ask("x")}
    headers = {"x-api-key": LIMITED}
    assert cluster.post("/v1/messages", body, headers=headers).status_code == 200
    second = cluster.post("/v1/messages", body, headers=headers)
    _error(second, 429, "rate_limit_error")
    assert "retry-after" in second.headers


def test_both_key_headers_on_messages_and_only_bearer_on_openai_routes(cluster: Cluster) -> None:
    """x-api-key or Authorization: Bearer on /v1/messages; the OpenAI routes keep to Bearer, as OpenAI's API."""
    body = {"model": "m", "max_tokens": 5, "messages": _ask("x")}
    assert cluster.post("/v1/messages", body, headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert cluster.post("/v1/messages", body, headers={"x-api-key": KEY}).status_code == 200
    chat = cluster.post("/v1/chat/completions", body, headers={"x-api-key": KEY})
    assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"


def test_an_anthropic_clients_model_list_is_anthropics(cluster: Cluster) -> None:
    """GET /v1/models with anthropic-version: the key's models as ModelInfo, x-api-key read; OpenAI's list otherwise."""
    assert sorted(m.id for m in cluster.client.models.list()) == ["claude-sonnet-4-5", "sim-m"]
    raw = httpx.get(cluster.router + "/v1/models", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert raw.status_code == 200 and raw.json()["has_more"] is False
    for entry in raw.json()["data"]:
        anthropic_schema.validate("model", entry)
    refused = httpx.get(cluster.router + "/v1/models", headers={"x-api-key": "wrong", "anthropic-version": "x"})
    _error(refused, 401, "authentication_error")
    openai_list = httpx.get(cluster.router + "/v1/models", headers={"authorization": f"Bearer {KEY}"}).json()
    assert openai_list["object"] == "list" and {m["object"] for m in openai_list["data"]} == {"model"}
