"""Check bodies and SSE chunks against OpenAI's published response schemas.

The schemas are ``llmgw/testing/openai/schemas.json`` (provenance in SOURCE.md
next to it): one JSON Schema 2020-12 document whose ``$defs`` hold the spec's
response roots. They ship inside the repository so that a bare clone, with
nothing beside it, runs every test; ``LLMGW_OPENAI_SCHEMAS`` names another copy.

A failure message names the kind, the JSON path of the bad value and the
schema rule it broke, and shows the object, so a test failure says what to fix
without a debugger.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import jsonschema

#: What a caller checks, and the root schema for it.
ROOTS: dict[str, str] = {
    "chat": "CreateChatCompletionResponse",
    "chat_chunk": "CreateChatCompletionStreamResponse",
    "completion": "CreateCompletionResponse",
    "completion_chunk": "CreateCompletionStreamChunk",
    "embedding": "CreateEmbeddingResponse",
    "models": "ListModelsResponse",
    "model": "Model",
    "error": "ErrorResponse",
}


def schemas_path() -> Path:
    """Where schemas.json is: $LLMGW_OPENAI_SCHEMAS, else the copy shipped beside this module."""
    override = os.environ.get("LLMGW_OPENAI_SCHEMAS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "openai" / "schemas.json"


@functools.cache
def _document() -> dict[str, Any]:
    path = schemas_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"OpenAI schemas not found at {path}; restore it from git "
                                "(llmgw/testing/openai/) or set LLMGW_OPENAI_SCHEMAS") from None


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    if kind not in ROOTS:
        raise KeyError(f"unknown kind {kind!r}; known: {', '.join(ROOTS)}")
    document = _document()
    # The root refers into the document's own $defs, so validate against a copy of the whole
    # document with the root as its top-level $ref.
    schema = {**document, "$ref": f"#/$defs/{ROOTS[kind]}"}
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def errors(kind: str, obj: Any) -> list[str]:
    """Every way ``obj`` fails the schema for ``kind``, one readable line each (empty when valid)."""
    found = sorted(_validator(kind).iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message} (rule {'/'.join(map(str, e.schema_path))})" for e in found]


def validate(kind: str, obj: Any) -> None:
    """Raise AssertionError, listing each problem, unless ``obj`` is a valid ``kind``."""
    problems = errors(kind, obj)
    if problems:
        shown = json.dumps(obj)[:2000]
        raise AssertionError(f"not a valid OpenAI {kind} ({ROOTS[kind]}):\n  " + "\n  ".join(problems)
                             + f"\nobject: {shown}")
