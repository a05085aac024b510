"""The OpenAI surface the sim engine speaks: request bodies read, error bodies and embeddings written.

Every body the sim sends validates against OpenAI's published schemas; an error is OpenAI-shaped JSON. An
embedding is a deterministic unit vector of the input's hash (``EMBEDDING_DIM`` values). Standard library
and aiohttp only: this package is also shipped alone as a wheel (``llmgw.testing.wheelhouse``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

from aiohttp import web

Json = dict[str, Any]

#: Compact JSON: the separators json.dumps adds by default are a tenth of a small chunk.
dumps = functools.partial(json.dumps, separators=(",", ":"))
#: Dimensions of a sim embedding: small, since what is tested is the wire, not the meaning.
EMBEDDING_DIM = 64
#: Inputs one embeddings request may carry (OpenAI's limit).
MAX_EMBEDDING_INPUTS = 2048


def error(status: int, message: str, *, type_: str, code: str | None = None,
          param: str | None = None) -> web.Response:
    """An OpenAI-shaped error response."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, dumps=dumps)


def embedding(text: str, *, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit vector for ``text``: the same text gives the same vector, in any process."""
    raw = b"".join(hashlib.sha256(f"{i}:{text}".encode()).digest() for i in range(-(-dim // 32)))
    values = [(b - 127.5) / 127.5 for b in raw[:dim]]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [round(v / norm, 6) for v in values]


async def json_body(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object, or the 400 that says why it is not one."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        return error(400, f"request body is not valid JSON: {e}", type_="invalid_request_error")
    if not isinstance(body, dict):
        return error(400, "request body must be a JSON object", type_="invalid_request_error")
    return body


def embedding_inputs(value: Any) -> list[str] | None:
    """An embeddings request's ``input`` as texts (token ids as their decimal text), None when it is not one."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and len(value) <= MAX_EMBEDDING_INPUTS:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    return None


def echo_pieces(body: Json) -> list[str]:
    """What ``--echo`` answers a chat with: the last user message's (or tool result's) text in word-sized pieces
    (each piece a token, with the whitespace before it, so newlines survive); ``[""]``-free, possibly empty."""
    messages = body.get("messages")
    text = ""
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict) and message.get("role") in ("user", "tool"):  # a tool's result answers too
                content = message.get("content")
                if isinstance(content, list):
                    content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                text = content if isinstance(content, str) else ""
    return re.findall(r"\s*\S+", text)


def prompt_chars(body: Json, *, chat: bool) -> int | None:
    """Characters of prompt in a request body (token ids count 4 each), None when it has none."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        total = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt)
        if all(isinstance(p, int) for p in prompt):
            return 4 * len(prompt)
        if all(isinstance(p, list) for p in prompt):
            return 4 * sum(len(p) for p in prompt)
    return None
