"""The Anthropic translation on plain data: requests to chat completions, answers and streams back, errors.

Every answer and stream made here is validated against the schemas made from the ``anthropic`` SDK's types.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.router import errors
from llmgw.router.anthropic import answer, convert
from llmgw.router.anthropic.events import Events
from llmgw.testing import anthropic_schema


def _sse(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (c.encode() if isinstance(c, str) else json.dumps(c).encode()) + b"\n\n"
                    for c in chunks)


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "served",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}


TEXT_STREAM = _sse(_chunk({"role": "assistant", "content": "Hel"}), _chunk({"content": "lo"}),
                   _chunk({}, "stop", stop_reason="END"),
                   {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "served", "choices": [],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
                              "prompt_tokens_details": {"cached_tokens": 4}}}, "[DONE]")


def _without_ids(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    found = anthropic_schema.events(body)
    found[0][1]["message"].pop("id")
    return found


def test_a_stream_cut_anywhere_translates_the_same() -> None:
    whole = Events("m", ["END"]).feed(TEXT_STREAM)
    for cut in (1, 7, 50, len(TEXT_STREAM) - 3):
        events = Events("m", ["END"])
        again = events.feed(TEXT_STREAM[:cut]) + events.feed(TEXT_STREAM[cut:]) + events.close()
        assert _without_ids(again) == _without_ids(whole)
    found = anthropic_schema.validate_stream(whole)
    text = "".join(d["delta"]["text"] for n, d in found if n == "content_block_delta")
    delta = dict(found)["message_delta"]
    assert text == "Hello"
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"]["input_tokens"] == 5 and delta["usage"]["cache_read_input_tokens"] == 4


def test_tool_calls_stream_as_tool_use_blocks_after_the_text() -> None:
    stream = _sse(_chunk({"role": "assistant", "content": "Let me look."}),
                  _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                          "function": {"name": "a", "arguments": '{"x":'}}]}),
                  _chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
                  _chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                          "function": {"name": "b", "arguments": "{}"}}]}),
                  _chunk({}, "tool_calls"), "[DONE]")
    found = anthropic_schema.validate_stream(Events("m", None).feed(stream))
    starts = [d for n, d in found if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "text"), (1, "tool_use"), (2, "tool_use")]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "a", "input": {}}
    partial = "".join(d["delta"]["partial_json"] for n, d in found
                      if n == "content_block_delta" and d["index"] == 1)
    assert json.loads(partial) == {"x": 1}
    assert dict(found)["message_delta"]["delta"]["stop_reason"] == "tool_use"


def test_keepalives_are_pings_and_an_error_ends_the_stream() -> None:
    events = Events("m", None)
    out = events.feed(b": keep-alive\n\n") + events.feed(_sse(_chunk({"content": "a"})))
    out += events.feed(b'data: {"error": {"message": "engine died", "type": "upstream_error", "code": null}}\n\n')
    out += events.close()
    found = anthropic_schema.validate_stream(out)
    assert [n for n, _ in found] == ["message_start", "ping", "ping", "content_block_start", "content_block_delta",
                                     "error"]
    assert found[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}


def test_a_stream_cut_short_still_ends_as_anthropics_does() -> None:
    events = Events("m", None)
    out = events.feed(_sse(_chunk({"content": "a"}, "length"))[:-1]) + events.close()
    found = anthropic_schema.validate_stream(out)
    assert dict(found)["message_delta"]["delta"]["stop_reason"] == "max_tokens"


def test_whole_answers() -> None:
    doc = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "ok", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    m = answer.message(doc, "asked", None)
    anthropic_schema.validate("message", m)
    assert m["model"] == "asked" and m["stop_reason"] == "tool_use"
    assert [b["type"] for b in m["content"]] == ["text", "tool_use", "tool_use"]
    assert m["content"][1]["input"] == {"a": [1]} and m["content"][2]["input"] == {"raw": "not json"}
    assert m["usage"]["input_tokens"] == 3 and m["usage"]["output_tokens"] == 4
    length = answer.message({"choices": [{"finish_reason": "length", "message": {"content": "x"}}]}, "m", None)
    assert length["stop_reason"] == "max_tokens"
    # llama.cpp says only "stop": a stop sequence it does not name is end_turn.
    unnamed = answer.message({"choices": [{"finish_reason": "stop", "message": {"content": "x"}}]}, "m", ["Z"])
    assert (unnamed["stop_reason"], unnamed["stop_sequence"]) == ("end_turn", None)


@pytest.mark.parametrize(("status", "code", "kind"), [
    (400, "invalid_request", "invalid_request_error"), (401, "invalid_api_key", "authentication_error"),
    (403, None, "permission_error"), (404, "model_not_found", "not_found_error"), (413, None, "invalid_request_error"),
    (429, "rate_limit_exceeded", "rate_limit_error"), (429, "model_overloaded", "overloaded_error"),
    (500, None, "api_error"), (502, "upstream_failed", "api_error"), (503, "model_not_ready", "overloaded_error")])
def test_error_types_follow_anthropics_statuses(status: int, code: str | None, kind: str) -> None:
    body = errors.ApiError(status, "why", type="x", code=code).body()
    out = json.loads(answer.error_body(status, body))
    anthropic_schema.validate("error", out)
    assert out == {"type": "error", "error": {"type": kind, "message": "why"}}


def test_requests_become_chat_completions() -> None:
    chat = convert.to_chat({
        "model": "m", "max_tokens": 10, "stream": True, "stop_sequences": ["S"],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AAAA"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "boom"}]}]}]})
    assert chat["stream_options"] == {"include_usage": True} and chat["stop"] == ["S"]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert "thinking" not in chat
    user, assistant, tool = chat["messages"]
    assert user["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert assistant == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"q": 1}'}}]}
    assert tool == {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"}
    assert convert.to_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                           count_only=True)["max_tokens"] == 1
    # A tool result's image (a screenshot) follows the tool message in a user message: a tool message is text.
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "BBBB"}}
    after = convert.to_chat({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "took it"}, shot]}]}]})["messages"]
    assert after == [{"role": "tool", "tool_call_id": "t1", "content": "took it"},
                     {"role": "user", "content": [{"type": "image_url",
                                                   "image_url": {"url": "data:image/png;base64,BBBB"}}]}]


@pytest.mark.parametrize(("doc", "field"), [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 5, "system": 3, "messages": [{"role": "user", "content": "x"}]}, "system"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages"),
    ({"model": "m", "max_tokens": 5, "stop_sequences": "S", "messages": [{"role": "user", "content": "x"}]},
     "stop_sequences"),
    ({"model": "m", "max_tokens": 5, "tool_choice": {"type": "bogus"}, "tools": [{"name": "f"}],
      "messages": [{"role": "user", "content": "x"}]}, "tool_choice"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
])
def test_bad_requests_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.ApiError) as refused:
        convert.to_chat(doc)
    assert refused.value.status == 400 and refused.value.param == field and field in refused.value.message
