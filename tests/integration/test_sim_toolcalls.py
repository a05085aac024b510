"""The sim engine's tool calls and stop sequences, through the real ``openai`` SDK, valid against OpenAI's schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.testing import openai_schema
from llmgw.testing.routed import started

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
    "required": ["q", "n", "unit"]}}}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("simtools")
    with started(tmp) as p:
        yield p.sim("m", "--echo", "--decode-tps", "2000")


def _chat(sim: str, **body: Any) -> httpx.Response:
    return httpx.post(sim + "/v1/chat/completions", json={"model": "m", **body}, timeout=30)


def test_a_tool_call_when_the_user_names_the_tool(sim: str) -> None:
    client = openai.OpenAI(base_url=sim + "/v1", api_key="x")
    asked = [{"role": "user", "content": "please lookup the weather"}]
    r = client.chat.completions.create(model="m", messages=asked, tools=[TOOL])  # type: ignore[list-item]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"q": "sim", "n": 1, "unit": "c"}
    openai_schema.validate("chat", _chat(sim, messages=asked, tools=[TOOL]).json())
    stream = client.chat.completions.create(model="m", messages=asked, tools=[TOOL], stream=True)  # type: ignore[list-item]
    chunks = list(stream)
    for chunk in chunks:
        openai_schema.validate("chat_chunk", chunk.model_dump(exclude_unset=True))
    pieces = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert pieces[0].id and pieces[0].function.name == "lookup"  # type: ignore[union-attr]
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"q": "sim", "n": 1, "unit": "c"}  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_no_tool_call_unless_asked(sim: str) -> None:
    """Not named, tool_choice none, or after the tool's result: text (the result echoed)."""
    plain = _chat(sim, messages=[{"role": "user", "content": "hello"}], tools=[TOOL]).json()
    assert plain["choices"][0]["message"]["content"] == "hello"
    none = _chat(sim, messages=[{"role": "user", "content": "lookup"}], tools=[TOOL], tool_choice="none").json()
    assert "tool_calls" not in none["choices"][0]["message"]
    forced = _chat(sim, messages=[{"role": "user", "content": "hi"}], tools=[TOOL], tool_choice="required").json()
    assert forced["choices"][0]["finish_reason"] == "tool_calls"
    after = _chat(sim, tools=[TOOL], messages=[
        {"role": "user", "content": "lookup"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found it"}]).json()
    assert after["choices"][0]["message"]["content"] == "found it" and after["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_cut_the_text_and_are_named(sim: str, stream: bool) -> None:
    """Cut before the first sequence found, finish_reason stop, vLLM's stop_reason naming the sequence."""
    r = _chat(sim, messages=[{"role": "user", "content": "one two three four"}], stop=["four", "ree"], stream=stream)
    if stream:
        docs = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        text = "".join(d["choices"][0]["delta"].get("content", "") for d in docs)
        last = docs[-1]["choices"][0]
    else:
        openai_schema.validate("chat", r.json())
        last = r.json()["choices"][0]
        text = last["message"]["content"]
    assert text == "one two th" and last["finish_reason"] == "stop" and last["stop_reason"] == "ree"
