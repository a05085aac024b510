"""An Anthropic Messages request turned into the OpenAI chat completion request the engines serve.

``to_chat`` reads the client's body (already JSON-decoded) and writes the chat completion body:

* ``system`` (a string or text blocks) becomes the first message, ``role: system``;
* each message's content (a string or blocks): ``text`` and ``image`` (base64 or URL) blocks become the
  message's content, an assistant's ``tool_use`` blocks its ``tool_calls``, a user's ``tool_result`` blocks
  one ``role: tool`` message each, placed first (OpenAI wants them right after the call they answer);
  ``thinking`` blocks (a model's earlier reasoning) are dropped, as Anthropic drops them from the prompt;
* ``tools`` become ``function`` tools, ``tool_choice`` auto/any/tool/none becomes auto/required/the
  function/none, ``disable_parallel_tool_use`` ``parallel_tool_calls: false``;
* ``stop_sequences`` → ``stop``, ``max_tokens`` (required, as Anthropic requires it) → ``max_tokens``,
  ``temperature``/``top_p``/``top_k`` as they are (vLLM and llama.cpp take ``top_k``), ``metadata.user_id`` →
  ``user``; a stream asks for its usage (``stream_options.include_usage``), which ``message_delta`` reports.

Anything else Anthropic defines (``thinking``, ``service_tier``, ``container``…) is accepted and not sent: an
engine would refuse what it does not know. What cannot be served (a server tool, a document block) is refused
with a 400 naming the field. A refusal is the router's ``errors.ApiError``; ``answer`` writes it in
Anthropic's shape.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.router import errors

Json = dict[str, Any]
_ROLES = ("user", "assistant")


def to_chat(doc: Json, *, count_only: bool = False) -> Json:
    """The chat completion body for ``doc``, an Anthropic Messages request; ``count_only``: a count_tokens body
    (no ``max_tokens`` needed; one token is generated, the prompt's count is the answer)."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: Field required (a non-empty string); GET /v1/models lists the models.", "model")
    out: Json = {"model": model, "messages": _system(doc.get("system")) + _messages(doc.get("messages"))}
    if count_only:
        out["max_tokens"] = 1
    else:
        limit = doc.get("max_tokens")
        if not _count(limit) or limit < 1:
            raise _bad(f"max_tokens: Field required: a positive integer, not {_shown(limit)}; Anthropic's "
                       "Messages API requires it.", "max_tokens")
        out["max_tokens"] = limit
        stream = doc.get("stream", False)
        if stream not in (True, False, None):
            raise _bad(f"stream: must be true or false, not {_shown(stream)}.", "stream")
        if stream:
            out["stream"] = True
            out["stream_options"] = {"include_usage": True}
        _sampling(doc, out)
    tools = doc.get("tools")
    if tools:
        out["tools"] = _tools(tools)
        _tool_choice(doc.get("tool_choice"), out)
    return out


def _bad(message: str, field: str) -> errors.ApiError:
    return errors.invalid_request(message, param=field)


def _shown(value: object) -> str:
    return "an object" if isinstance(value, dict) else "an array" if isinstance(value, list) else json.dumps(value)[:40]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sampling(doc: Json, out: Json) -> None:
    for field in ("temperature", "top_p", "top_k"):
        value = doc.get(field)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _bad(f"{field}: must be a number, not {_shown(value)}.", field)
        out[field] = value
    stops = doc.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise _bad("stop_sequences: must be a list of non-empty strings.", "stop_sequences")
        out["stop"] = stops
    metadata = doc.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _bad(f"metadata: must be an object such as {{\"user_id\": \"...\"}}, not {_shown(metadata)}.",
                       "metadata")
        user = metadata.get("user_id")
        if isinstance(user, str) and user:
            out["user"] = user


def _system(system: object) -> list[Json]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        return [{"role": "system", "content": _text_of(system, "system")}]
    raise _bad(f"system: must be a string or a list of text blocks, not {_shown(system)}.", "system")


def _text_of(blocks: list[Any], where: str) -> str:
    """The text of a list of text blocks (``system``, a tool result's content)."""
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _bad(f"{where}.{i}: must be a text block ({{\"type\": \"text\", \"text\": \"...\"}}).", where)
        texts.append(block["text"])
    return "\n\n".join(texts)


def _messages(messages: object) -> list[Json]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: Field required: a non-empty list of {\"role\", \"content\"} objects.", "messages")
    out: list[Json] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _bad(f"{where}.role: must be 'user' or 'assistant' (the system prompt goes in 'system').",
                       "messages")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            out.extend(_blocks(message["role"], content, where))
        else:
            raise _bad(f"{where}.content: must be a string or a list of content blocks.", "messages")
    return out


def _blocks(role: str, blocks: list[Any], where: str) -> list[Json]:
    """One message's blocks as chat messages: its tool results first (user), then the message itself."""
    results: list[Json] = []
    parts: list[Json] = []
    calls: list[Json] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content.{j}"
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image(block.get("source"), at))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _bad(f"{at}: a tool_use block needs 'id' and 'name' (strings).", "messages")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise _bad(f"{at}: a tool_result block needs 'tool_use_id' (the tool_use block's id).", "messages")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result_text(block.get("content"), block.get("is_error") is True, at, parts)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise _bad(f"{at}: a {kind!r} block is not served in a {role} message here; send text, image (user), "
                       "tool_use (assistant) or tool_result (user) blocks.", "messages")
    message: Json = {"role": role}
    if all(p["type"] == "text" for p in parts):
        message["content"] = "\n\n".join(p["text"] for p in parts) if parts or not calls else None
    else:
        message["content"] = parts
    if calls:
        message["tool_calls"] = calls
    if results and not parts:
        return results  # a turn of tool results only: no empty user message after them
    return [*results, message]


def _image(source: object, at: str) -> Json:
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    elif isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _bad(f"{at}.source: an image's source must be base64 (media_type, data) or a url.", "messages")
    return {"type": "image_url", "image_url": {"url": url}}


def _result_text(content: object, is_error: bool, at: str, images: list[Json]) -> str:
    """A tool result's text (a ``tool`` message holds only text); its images go to ``images``, the user message
    that follows the tool messages (a screenshot a tool took reaches a model that reads images)."""
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for i, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "image":
                images.append(_image(block.get("source"), f"{at}.content.{i}"))
            elif kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            else:
                raise _bad(f"{at}.content.{i}: a tool result's content blocks must be text or image.", "messages")
        text = "\n\n".join(texts)
    else:
        raise _bad(f"{at}.content: a tool result's content must be a string or text and image blocks.", "messages")
    return f"Error: {text}" if is_error else text


def _tools(tools: object) -> list[Json]:
    if not isinstance(tools, list):
        raise _bad("tools: must be a list of {\"name\", \"description\", \"input_schema\"} objects.", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom") or not isinstance(
                tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(f"tools.{i}: only client tools (name, description, input_schema) are served here, not "
                       f"{kind!r}: the engine runs no server tools.", "tools")
        function: Json = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: object, out: Json) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):  # type: ignore[union-attr]
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}  # type: ignore[index]
    else:
        raise _bad("tool_choice: must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                   "{\"type\": \"tool\", \"name\": ...}.", "tool_choice")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
