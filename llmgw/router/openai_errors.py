"""Engine error answers in OpenAI's shape: any error body rebuilt as OpenAI's ``ErrorResponse``.

(The rare path: parsed and rebuilt, cost does not matter.) OpenAI's
``ErrorResponse`` is ``{"error": {"message", "type", "param", "code"}}`` with all
four required and ``param``/``code`` strings or null. Engines differ: llama.cpp
writes ``{"error": {"code": 400, "message", "type"}}`` (an integer code, no
param), vLLM an integer code too, a FastAPI server ``{"detail": ...}``, a proxy in
front of an engine an HTML page, a crashing one nothing. ``error_body`` turns
any of these into the schema's shape and keeps the engine's message word for
word (extra fields of its error object, such as llama.cpp's ``n_ctx``, stay);
the HTTP status is the relay's and stays. Decisions:

* an integer ``code`` is an HTTP status (llama.cpp and vLLM put the status
  there), which the response's status already says: it becomes null, so a
  client matching OpenAI's codes (words such as ``context_length_exceeded``)
  never sees a new vocabulary of numeric strings; any other non-string code
  becomes its string;
* ``code`` null and llama.cpp's ``exceed_context_size_error`` type: OpenAI's
  ``context_length_exceeded``, what clients look for to trim a conversation;
* llama.cpp's "input (N tokens) is too large to process" (an input over its physical
  batch; the router relays that 500 as a 400, ``upstream``): type
  ``invalid_request_error``, code ``context_length_exceeded``, param ``input``;
* ``param`` missing: the field llama.cpp's message names ("'messages' is
  required", "Field 'max_tokens': ..."), else null;
* ``type`` missing: the one OpenAI uses for the status (400 invalid_request_error,
  401 authentication_error, 404 not_found_error, 429 rate_limit_error, 5xx
  server_error, ...).

An ``{"error": ...}`` event inside a stream (llama.cpp writes one and stops when
a task fails after its first token) is rewritten the same way (``openai_shape.Shaper``).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from typing import Any

#: The type OpenAI gives each status, for an engine error that says none.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "conflict_error", 422: "invalid_request_error", 429: "rate_limit_error"}
#: OpenAI's code for an engine's error type, where one exists.
_CODES = {"exceed_context_size_error": "context_length_exceeded"}
#: Where llama.cpp's messages name the request field at fault.
_PARAMS = (re.compile(r"^'(\w+)' is required"), re.compile(r"^Field '(\w+)'"), re.compile(r"key '(\w+)' not found"))
#: llama.cpp's message for an input longer than its physical batch (an embedding input, mostly).
_TOO_LARGE = re.compile(r"^input \(\d+ tokens\) is too large to process")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_TAGS = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.I | re.S)
_SPACE = re.compile(r"\s+")
#: An engine's text quoted in a message is cut here: a whole HTML page helps nobody.
MAX_QUOTED = 500


def default_type(status: int) -> str:
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def summary(text: str) -> str:
    """A non-JSON error body in one line: an HTML page's title (else its text), whitespace folded, cut short."""
    if "<" in text and ">" in text:
        title = _TITLE.search(text)
        text = html.unescape(title.group(1) if title and title.group(1).strip() else _TAGS.sub(" ", text))
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "..."


def error_object(status: int, body: bytes, *, replica_id: str) -> dict[str, Any]:
    """The ``error`` object of OpenAI's ErrorResponse for an engine's error answer ``body`` with ``status``."""
    text = body.decode("utf-8", "replace").strip()
    where = f"The engine (replica {replica_id}) answered HTTP {status}"
    if not text:
        return _error(status, f"{where} with an empty body. Retry, or check `llmgw get replicas`.")
    try:
        doc = json.loads(text)
    except ValueError:
        return _error(status, f"{where}: {summary(text)}")
    if isinstance(doc, Mapping):
        inner = doc.get("error")
        if isinstance(inner, Mapping):
            return _from_fields(status, inner, where)
        if isinstance(inner, str) and inner:  # {"error": "..."}
            return _error(status, inner, param=_param(inner))
        if "detail" in doc:  # FastAPI: a string, or validation errors [{"loc", "msg", ...}]
            return _from_detail(status, doc["detail"], where)
        if isinstance(doc.get("message"), str):  # older vLLM: {"object": "error", "message": ...} flat
            return _from_fields(status, doc, where)
    return _error(status, f"{where}: {summary(json.dumps(doc, ensure_ascii=False))}")


def error_body(status: int, body: bytes, *, replica_id: str) -> bytes:
    """``body`` as OpenAI's ErrorResponse; the same bytes when it already is one."""
    obj = error_object(status, body, replica_id=replica_id)
    try:
        if json.loads(body) == {"error": obj}:
            return body  # already the shape: the engine's bytes, untouched
    except ValueError:
        pass
    return json.dumps({"error": obj}, ensure_ascii=False).encode()


def _error(status: int, message: str, *, type: str | None = None, param: str | None = None,
           code: str | None = None) -> dict[str, Any]:
    return {"message": message, "type": type or default_type(status), "param": param, "code": code}


def _param(message: str) -> str | None:
    for pattern in _PARAMS:
        found = pattern.search(message)
        if found:
            return found.group(1)
    return None


def _from_fields(status: int, fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        message = f"{where}: {summary(json.dumps(dict(fields), ensure_ascii=False))}"
    type_ = fields.get("type") if isinstance(fields.get("type"), str) and fields.get("type") else None
    param = fields.get("param")
    param = param if isinstance(param, str) else (_param(message) if param is None else str(param))
    code = fields.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        code = None  # the HTTP status again (see the module docstring)
    elif code is not None and not isinstance(code, str):
        code = json.dumps(code)
    if code is None and type_ in _CODES:
        code = _CODES[type_]
    if _TOO_LARGE.match(message):
        type_, code, param = "invalid_request_error", code or "context_length_exceeded", param or "input"
    extra = {k: v for k, v in fields.items() if k not in ("message", "type", "param", "code", "object")}
    return {**extra, **_error(status, message, type=type_, param=param, code=code)}


def _from_detail(status: int, detail: Any, where: str) -> dict[str, Any]:
    if isinstance(detail, str) and detail:
        return _error(status, detail, param=_param(detail))
    if isinstance(detail, list) and detail and all(isinstance(d, Mapping) for d in detail):
        parts, param = [], None
        for d in detail:
            loc = [str(p) for p in d.get("loc", ()) if p != "body"]
            parts.append(f"{'.'.join(loc)}: {d.get('msg', '')}" if loc else str(d.get("msg", "")))
            if param is None and loc:
                param = loc[0]
        return _error(status, "; ".join(parts), param=param)
    return _error(status, f"{where}: {summary(json.dumps(detail, ensure_ascii=False))}")
