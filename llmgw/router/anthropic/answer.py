"""What the engine answered (an OpenAI chat completion, or an error) in Anthropic's shapes.

* ``message``: a chat completion as an Anthropic ``Message``: the text as a ``text`` block, each tool call
  as a ``tool_use`` block (its arguments parsed into ``input``), ``finish_reason`` as ``stop_reason``
  (``stop_reason``), the usage as ``input_tokens``/``output_tokens`` (prompt tokens read from the engine's
  cache reported as ``cache_read_input_tokens``, outside ``input_tokens`` as Anthropic counts them);
* ``error``: any refusal, the router's own or an engine's OpenAI-shaped one, as Anthropic's
  ``{"type": "error", "error": {"type", "message"}}``, its type from the status as Anthropic's API uses them
  (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error,
  429 rate_limit_error, 500 api_error, 503/529 overloaded_error; any other 4xx, 413 among them, an
  invalid_request_error: the SDK's error types have no request_too_large); the router's full admission
  queue (a 429 ``model_overloaded``) is an overloaded_error.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

Json = dict[str, Any]

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
          403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
          503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def error_type(status: int, code: object = None) -> str:
    if code == "model_overloaded":
        return "overloaded_error"
    return _TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def error(status: int, message: str, code: object = None) -> Json:
    return {"type": "error", "error": {"type": error_type(status, code), "message": message}}


def error_body(status: int, body: bytes) -> bytes:
    """An engine's or the router's error body (OpenAI's shape, or any) as Anthropic's."""
    message, code = _error_text(body)
    return json.dumps(error(status, message or f"The engine answered HTTP {status}.", code)).encode()


def _error_text(body: bytes) -> tuple[str, object]:
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:2000], None
    inner = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(inner, dict):
        return str(inner.get("message") or ""), inner.get("code")
    if isinstance(inner, str):
        return inner, None
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return doc["message"], doc.get("code")
    return "", None


def stop_reason(finish: object, matched: object, stops: list[str] | None, tool_calls: bool) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for OpenAI's ``finish_reason``.

    A stop sequence is known to have matched when the engine says which (vLLM's ``stop_reason``, the matched
    string, on the choice); an engine that does not say (llama.cpp) reports ``end_turn``.
    """
    if tool_calls or finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if isinstance(matched, str) and stops and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def usage(doc: object) -> Json:
    """Anthropic's usage for an OpenAI usage object (zeros without one)."""
    prompt = completion = cached = 0
    if isinstance(doc, dict):
        prompt = _int(doc.get("prompt_tokens"))
        completion = _int(doc.get("completion_tokens"))
        details = doc.get("prompt_tokens_details")
        cached = min(_int(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    return {"input_tokens": prompt - cached, "output_tokens": completion, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def tool_input(arguments: object) -> Json:
    """A tool call's arguments (a JSON string) as ``input``, an object; what is not one is kept under ``raw``."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        return {"raw": arguments}
    return parsed if isinstance(parsed, dict) else {"raw": parsed}


def message(doc: Json, model: str, stops: list[str] | None) -> Json:
    """A chat completion ``doc`` as an Anthropic ``Message`` for ``model`` (the name the client asked)."""
    choices = doc.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    said = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content: list[Json] = []
    text = said.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = said.get("tool_calls") if isinstance(said.get("tool_calls"), list) else []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"),
                            "name": str(function.get("name") or ""), "input": tool_input(function.get("arguments"))})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stops, bool(calls))
    return {"id": message_id(), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(doc.get("usage"))}
