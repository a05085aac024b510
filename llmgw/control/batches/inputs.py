"""A batch's input file read line by line: each line a request to run, or an error for the error file.

A line is ``{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>", "body": {...}}`` (OpenAI's
batch input). A line that is not that (bad JSON, a field missing or of the wrong kind, another URL, a
``custom_id`` seen before, no ``model`` in the body) is an invalid line: it goes to the error file with its
``custom_id`` (when it had one) and what was wrong, and the batch runs the rest. Blank lines are skipped.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.control.store.batches import NewLine

#: The endpoints a batch may run, as OpenAI's ``endpoint`` names them.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


def _error(code: str, message: str) -> str:
    return json.dumps({"code": code, "message": message})


def read_lines(data: bytes, endpoint: str) -> list[NewLine]:
    out: list[NewLine] = []
    seen: set[str] = set()
    for idx, raw in enumerate(data.split(b"\n")):
        if not raw.strip():
            continue
        out.append(_line(idx, raw, endpoint, seen))
    return out


def _line(idx: int, raw: bytes, endpoint: str, seen: set[str]) -> NewLine:
    where = f"line {idx + 1}"
    try:
        doc: Any = json.loads(raw)
    except ValueError as exc:
        return NewLine(idx, None, error=_error("invalid_json", f"{where} is not JSON ({exc.msg}); each line is one "
                                                               "JSON object"))
    if not isinstance(doc, dict):
        return NewLine(idx, None, error=_error("invalid_request", f"{where} is not a JSON object"))
    custom_id = doc.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return NewLine(idx, None, error=_error("missing_custom_id", f"{where} has no custom_id (a non-empty string "
                                                                   "of at most 512 characters)"))
    if custom_id in seen:
        return NewLine(idx, custom_id, error=_error("duplicate_custom_id", f"{where}: custom_id {custom_id!r} is "
                                                                          "another line's; each must be unique"))
    seen.add(custom_id)
    method, url, body = doc.get("method"), doc.get("url"), doc.get("body")
    if method != "POST":
        return NewLine(idx, custom_id, error=_error("invalid_method", f"{where}: method must be \"POST\""))
    if url != endpoint:
        return NewLine(idx, custom_id, error=_error("invalid_url", f"{where}: url {url!r} is not the batch's "
                                                                   f"endpoint {endpoint}"))
    if not isinstance(body, dict):
        return NewLine(idx, custom_id, error=_error("missing_body", f"{where} has no body (the request's JSON "
                                                                    "object)"))
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 253:
        return NewLine(idx, custom_id, error=_error("missing_model", f"{where}: body.model must name a model"))
    if body.get("stream"):
        return NewLine(idx, custom_id, error=_error("invalid_request", f"{where}: a batch line cannot stream; "
                                                                       "leave body.stream out"))
    return NewLine(idx, custom_id, model=model, body=json.dumps(body, separators=(",", ":")))
