"""Check llmgw's Anthropic Messages answers and stream events against Anthropic's published shapes.

The schemas are ``llmgw/testing/anthropic/schemas.json``, made from the ``anthropic`` SDK's own types
(provenance and how to regenerate: SOURCE.md beside it). ``validate(kind, obj)`` raises an AssertionError
naming the JSON path and rule of each problem; ``validate_stream(body)`` checks every event of an SSE body:
its ``event:`` line matches its data's ``type``, each data object is valid, and the events come in
Anthropic's order.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

ROOTS: dict[str, str] = {
    "message": "Message",
    "count": "MessageTokensCount",
    "event": "RawMessageStreamEvent",
    "error": "ErrorResponse",
    "model": "ModelInfo",
}


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    document = json.loads((Path(__file__).resolve().parent / "anthropic" / "schemas.json").read_text())
    schema = {**document, "$ref": f"#/$defs/{ROOTS[kind]}"}
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def errors(kind: str, obj: Any) -> list[str]:
    found = sorted(_validator(kind).iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message[:300]} (rule {'/'.join(map(str, e.schema_path))})" for e in found]


def validate(kind: str, obj: Any) -> None:
    problems = errors(kind, obj)
    if problems:
        raise AssertionError(f"not a valid Anthropic {kind} ({ROOTS[kind]}):\n  " + "\n  ".join(problems)
                             + f"\nobject: {json.dumps(obj)[:2000]}")


def events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """An SSE body's events as (event name, data object)."""
    out = []
    for raw in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not raw.strip():
            continue
        fields: dict[str, str] = {}
        for line in raw.decode().split("\n"):
            name, _, value = line.partition(":")
            fields[name] = fields.get(name, "") + value.lstrip()
        out.append((fields.get("event", ""), json.loads(fields["data"])))
    return out


def validate_stream(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Check every event of a Messages stream, and their order; the events, for more checks."""
    found = events(body)
    assert found, "the stream has no events"
    for name, data in found:
        assert name == data.get("type"), f"event line {name!r} but data type {data.get('type')!r}"
        if name == "ping":
            assert data == {"type": "ping"}, data
        elif name == "error":
            validate("error", data)
        else:
            validate("event", data)
    names = [n for n, _ in found if n != "ping"]
    if names[-1] == "error":
        return found
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    open_index = None
    for name, data in found:
        if name == "content_block_start":
            assert open_index is None, f"block {data['index']} started inside block {open_index}"
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index, f"a delta for block {data['index']} while {open_index} is open"
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert open_index is None, "a content block was never stopped"
    return found
