"""Reading a client's completion request: only what routing needs, the rest passes untouched.

The router decodes the body once to learn ``model`` and ``stream`` and otherwise
treats it as opaque bytes: the engine validates the rest and answers in its own
words. The bytes are re-encoded only when the client asked for the model by an
alias or its llmgw name, because the engine knows only its served name (llama.cpp
answers an unknown name with 200 and its own model, vLLM with 404).
"""

from __future__ import annotations

import dataclasses
import json

from llmgw.router import errors


@dataclasses.dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What the router needs from a completion request body."""

    model: str
    stream: bool
    doc: dict[str, object]
    body: bytes


def parse(body: bytes) -> CompletionRequest:
    """Decode ``body``; raise a 400 ``ApiError`` that says what is wrong with it."""
    if not body:
        raise errors.invalid_request("The request body is empty; send a JSON object with a 'model' field.")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.invalid_request(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(doc, dict):
        raise errors.invalid_request(f"The request body must be a JSON object, not {type(doc).__name__}.")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise errors.invalid_request("The request body has no 'model' field (a non-empty string); "
                                     "GET /v1/models lists the models.", param="model")
    stream = doc.get("stream", False)
    return CompletionRequest(model=model, stream=stream is True, doc=doc, body=body)


def for_engine(request: CompletionRequest, served_name: str) -> bytes:
    """The bytes to send the engine: the client's, or re-encoded with ``model`` set to its served name."""
    if request.model == served_name:
        return request.body
    doc = dict(request.doc)
    doc["model"] = served_name
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
