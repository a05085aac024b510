"""What the sim engine's chat answers add to its text: a tool call when asked for one, and stop sequences.

A tool call, in OpenAI's ``tool_calls`` format (the published spec's ``ChatCompletionMessageToolCall`` in a
whole answer, ``ChatCompletionMessageToolCallChunk`` in a stream's deltas: ``llmgw/testing/openai/schemas.json``,
from ``openai/openai-openapi``), is made when the request has ``tools``, its last message is the user's (not a
tool's result) and either ``tool_choice`` asks for one (``"required"`` or a named function) or the user's
last message names a tool. The call is to that tool, with arguments made from its JSON Schema's required
properties (a string ``"sim"``, a number 1, a boolean true, …); ``finish_reason`` is ``"tool_calls"`` and the
arguments stream in pieces of 8 characters, the first delta carrying the id and the name, as OpenAI's do.

Stop sequences (``stop``, a string or a list) cut the text before the first one found, as OpenAI's engines do
(the sequence itself not returned), with ``finish_reason`` ``"stop"`` and the matched string as the choice's
``stop_reason``, vLLM's extension (``ChatCompletionResponseChoice.stop_reason`` in vLLM 0.32's
``vllm/entrypoints/openai/chat_completion/protocol.py``: "not part of the OpenAI spec but included in vLLM").
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

Json = dict[str, Any]
_PLACEHOLDER = {"string": "sim", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """A chat answer's pieces (a token each), its finish reason, and what it adds to the choice."""

    pieces: list[str]
    finish: str
    stop_reason: str | None = None
    call: Json | None = None  # the tool call, whose arguments ``pieces`` are when set


def shape(body: Json, pieces: list[str], finish: str) -> Answer:
    """The answer to ``body``: a tool call when one is asked for, else ``pieces`` cut at a stop sequence."""
    call = tool_call(body)
    if call is not None:
        arguments = call["function"]["arguments"]
        return Answer([arguments[i:i + 8] for i in range(0, len(arguments), 8)] or [""], "tool_calls", call=call)
    stops = body.get("stop")
    stops = [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else []
    text = "".join(pieces)
    found = [(text.find(s), s) for s in stops if isinstance(s, str) and s and s in text]
    if not found:
        return Answer(pieces, finish)
    at, matched = min(found)
    kept: list[str] = []
    total = 0
    for piece in pieces:
        if total + len(piece) > at:
            if at > total:
                kept.append(piece[:at - total])
            break
        kept.append(piece)
        total += len(piece)
    return Answer(kept or [""], "stop", stop_reason=matched)


def tool_call(body: Json) -> Json | None:
    tools = [t["function"] for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"
             and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)]
    messages = body.get("messages")
    choice = body.get("tool_choice")
    if not tools or choice == "none" or not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        wanted = [t for t in tools if t["name"] == choice["function"].get("name")]
    elif choice == "required":
        wanted = tools
    else:
        text = _text(last.get("content"))
        wanted = [t for t in tools if t["name"] in text]
    if not wanted:
        return None
    tool = wanted[0]
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": tool["name"], "arguments": json.dumps(_arguments(tool.get("parameters")))}}


def _text(content: object) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _arguments(schema: object) -> Json:
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    out: Json = {}
    for name in required:
        prop = properties.get(name) if isinstance(properties.get(name), dict) else {}
        enum = prop.get("enum")
        out[name] = enum[0] if isinstance(enum, list) and enum else _PLACEHOLDER.get(str(prop.get("type")), "sim")
    return out


def message(answer: Answer, text: str) -> Json:
    """A whole answer's ``message``."""
    if answer.call is not None:
        return {"role": "assistant", "content": None, "refusal": None, "tool_calls": [answer.call]}
    return {"role": "assistant", "content": text, "refusal": None}


def delta(answer: Answer, i: int, piece: str) -> Json:
    """Piece ``i``'s ``delta`` in a stream."""
    if answer.call is None:
        return {"content": piece} if i else {"role": "assistant", "content": piece}
    if i == 0:
        call = answer.call
        return {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": call["id"], "type": "function",
             "function": {"name": call["function"]["name"], "arguments": piece}}]}
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def choice_extra(answer: Answer, last: bool) -> Json:
    """What the last choice carries beyond OpenAI's fields: the matched stop sequence (vLLM's ``stop_reason``)."""
    return {"stop_reason": answer.stop_reason} if last and answer.stop_reason is not None else {}
