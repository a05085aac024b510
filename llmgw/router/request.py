"""Reading a client's completion request: only what routing needs, the rest passes untouched.

The router decodes the body once to learn ``model`` and ``stream`` and otherwise
treats it as opaque bytes: the engine validates the rest and answers in its own
words. Other proxies drop ``user`` or rename ``max_tokens`` on the way; here the
engine gets exactly what the client sent, ``stream_options`` included.

The one change is ``model``, when the client asked by an alias or its llmgw
name, because the engine knows only its served name (llama.cpp answers an
unknown name with 200 and its own model, vLLM with 404). Only the value's bytes
are replaced: re-encoding the document would reformat numbers (``1e3`` becomes
``1000.0``), fold duplicate keys and change whitespace, bytes that a client may
have signed or an engine's cache may key on.

The other, for a streamed request to llama.cpp only (``with_progress``):
``"return_progress":true`` goes in front, so the engine writes a progress event
after each prefill batch. llama.cpp notices a client that left only when it
writes to it; without those writes a client that leaves during a long prefill
keeps its slot busy until the prefill ends (seconds on a CPU), with them it is
stopped within two batches. The router reads and drops the events it asked for
(``upstream``): the client gets the stream it would have got without them.
"""

from __future__ import annotations

import dataclasses
import json
import re

from llmgw.core import engines
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
        doc = _loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.invalid_request(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:  # 100,000 "[" (100 kB) was a 500 with a traceback in the log
        raise errors.invalid_request("The request body is nested too deeply to read; "
                                     "send a JSON object a few levels deep.") from None
    if not isinstance(doc, dict):
        raise errors.invalid_request(f"The request body must be a JSON object, not {type(doc).__name__}.")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise errors.invalid_request("The request body has no 'model' field (a non-empty string); "
                                     "GET /v1/models lists the models.", param="model")
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        # "yes" or 1 used to read as "not streamed" and got a 200 that the client did not expect;
        # OpenAI refuses a non-boolean with a 400 naming the field, and so do we.
        raise errors.invalid_request(f"'stream' must be true or false (or null), not {_shown(stream)}.",
                                     param="stream")
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise errors.invalid_request("'stream_options' must be an object such as {\"include_usage\": true} (or "
                                     f"null), not {_shown(options)}.", param="stream_options")
    return CompletionRequest(model=model, stream=stream is True, doc=doc, body=body)


def _shown(value: object) -> str:
    """A refused value as the message shows it: a scalar as JSON (cut short), a container by its kind."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"
    return json.dumps(value)[:40]


def _loads(body: bytes) -> object:
    """``json.loads(body)``, at a quarter of its cost for the usual UTF-8 body.

    ``json.loads`` on bytes first sniffs the encoding and decodes with
    ``surrogatepass``: 3 us of a 4 us parse for a short request. A body that is
    not plain UTF-8 JSON (a BOM, UTF-16, an encoded lone surrogate, or simply
    invalid) goes to ``json.loads`` as it is, so what is accepted and every error
    message stay exactly ``json.loads``'s.
    """
    if not body.startswith(b"\xef\xbb\xbf"):
        try:
            return _DECODER.decode(body.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError too
            pass
    return json.loads(body)


def for_engine(request: CompletionRequest, served_name: str) -> bytes:
    """The bytes to send the engine: the client's, with only ``model``'s value replaced when it differs."""
    if request.model == served_name:
        return request.body
    value = json.dumps(served_name, ensure_ascii=False)
    try:
        text = request.body.decode("utf-8")
        span = _model_span(text)
    except ValueError:  # not UTF-8 (json.loads also reads UTF-16 and 32), or not what parse() read
        span = None
    if span is None:
        doc = dict(request.doc)
        doc["model"] = served_name
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    start, end = span
    return (text[:start] + value + text[end:]).encode("utf-8")


_PROGRESS_FIELD = b'"return_progress":true,'


def wants_progress(request: CompletionRequest, engine: str) -> bool:
    """Whether the router asks ``engine`` for prefill progress: a stream whose client did not ask itself."""
    if not request.stream or "return_progress" in request.doc:
        return False
    # Whether its streams report prefill progress when asked is the engine's record's.
    found = engines.record(engine)
    return found is not None and found.reports_prefill_progress


def with_progress(body: bytes) -> bytes | None:
    """``body`` (a JSON object ``parse`` read) with ``"return_progress":true`` first; None if not UTF-8 text."""
    start = len(body) - len(body.lstrip(b" \t\r\n"))
    if body[start:start + 1] != b"{" or body[start + 1:start + 2] == b"\x00":
        return None  # a BOM, or UTF-16/32 JSON (parse() reads those): leave the body as the client sent it
    return body[:start + 1] + _PROGRESS_FIELD + body[start + 1:]


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i``."""
    match = _WS.match(text, i)
    return match.end() if match else i


def _model_span(text: str) -> tuple[int, int] | None:
    """Where the value of the top-level ``model`` key is in ``text``, a JSON object, or None.

    The last occurrence, because that is the one ``json.loads`` (and so ``parse``) kept.
    """
    i = _skip(text, 0)
    if text[i:i + 1] != "{":
        return None
    i = _skip(text, i + 1)
    span = None
    while text[i:i + 1] == '"':
        key, i = json.decoder.scanstring(text, i + 1)
        i = _skip(text, i)
        if text[i:i + 1] != ":":
            return None
        _, end = _DECODER.raw_decode(text, _skip(text, i + 1))
        if key == "model":
            span = (_skip(text, i + 1), end)
        i = _skip(text, end)
        if text[i:i + 1] == ",":
            i = _skip(text, i + 1)
        elif text[i:i + 1] == "}":
            return span
        else:
            return None
    return None
