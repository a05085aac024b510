"""Reading completion requests and the router's own error bodies."""

from __future__ import annotations

import json

import pytest

from llmgw.router import errors, request
from llmgw.testing import openai_schema


def test_parse_reads_model_and_stream() -> None:
    """model and stream are read; the body bytes are kept as they came."""
    body = b'{"model": "m", "stream": true, "messages": []}'
    req = request.parse(body)
    assert (req.model, req.stream, req.body) == ("m", True, body)
    assert request.parse(b'{"model": "m", "stream": null}').stream is False
    with pytest.raises(errors.ApiError) as refused:  # as OpenAI: a non-boolean is a 400, not "not streamed"
        request.parse(b'{"model": "m", "stream": "yes"}')
    assert (refused.value.status, refused.value.param) == (400, "stream")


@pytest.mark.parametrize(("body", "says"), [
    (b"", "empty"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'"a string"', "JSON object"),
    (b"42", "JSON object"),
    (b"[" * 100_000, "nested too deeply"),  # was a RecursionError, a 500 (issue 13)
    (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"messages": []}', "'model'"),
    (b'{"model": 3}', "'model'"),
])
def test_parse_refuses_with_400(body: bytes, says: str) -> None:
    """Bodies without a usable model are a 400 invalid_request_error that says what is wrong."""
    with pytest.raises(errors.ApiError) as info:
        request.parse(body)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    assert says in info.value.message


def test_for_engine_keeps_bytes_when_name_is_served_name() -> None:
    """The client's bytes go upstream untouched when it used the served name."""
    body = b'{ "model":"served",  "prompt": "x" }'
    assert request.for_engine(request.parse(body), "served") is body


def test_for_engine_rewrites_an_alias() -> None:
    """An alias is replaced by the served name; every other field is kept."""
    req = request.parse('{"model": "alias", "prompt": "héllo", "max_tokens": 3}'.encode())
    assert json.loads(request.for_engine(req, "served")) == {"model": "served", "prompt": "héllo",
                                                             "max_tokens": 3}


@pytest.mark.parametrize("error", [
    errors.invalid_request("bad"),
    errors.model_not_found("x", ["a", "b"]),
    errors.no_ready_endpoint("x", "Starting", "0 of 1 replicas Ready"),
    errors.table_not_loaded("the control plane"),
    errors.upstream_failed("x", ["r1: refused"]),
    errors.path_not_found("GET", "/v1/nope"),
    errors.method_not_allowed("GET", "/v1/completions", "POST"),
    errors.body_too_large(10),
    errors.failed_mid_stream("r-1", "connection reset"),
    errors.embeddings_not_served("x", "llamacpp", "--embeddings"),
    errors.embeddings_not_served("x", "", ""),
])
def test_error_bodies_match_openai_schema(error: errors.ApiError) -> None:
    """Each of the router's refusals is a valid OpenAI ErrorResponse."""
    openai_schema.validate("error", json.loads(error.body()))


def test_not_found_lists_models_and_not_ready_names_next_step() -> None:
    """404 lists what exists; 503 carries state, message and the command to run."""
    assert "a, b" in errors.model_not_found("x", ["a", "b"]).message
    message = errors.no_ready_endpoint("x", "Starting", "0 of 1 replicas Ready").message
    assert "Starting" in message and "0 of 1 replicas Ready" in message and "llmgw get replicas" in message


def test_progress_is_asked_of_llamacpp_streams_only() -> None:
    """Only a stream to llama.cpp, whose client did not ask for progress itself, gets the router's field."""
    stream = request.parse(b'{"model": "m", "stream": true}')
    assert request.wants_progress(stream, "llamacpp")
    assert not request.wants_progress(stream, "vllm")
    assert not request.wants_progress(stream, "")
    assert not request.wants_progress(request.parse(b'{"model": "m"}'), "llamacpp")
    asked = request.parse(b'{"model": "m", "stream": true, "return_progress": false}')
    assert not request.wants_progress(asked, "llamacpp")


def test_with_progress_adds_one_member_and_keeps_every_other_byte() -> None:
    """The field goes first; the client's bytes follow unchanged, whitespace and number spellings included."""
    body = b' {"model": "m", "stream": true, "max_tokens": 1e1,\n "user": "u"}'
    changed = request.with_progress(body)
    assert changed == b' {"return_progress":true,"model": "m", "stream": true, "max_tokens": 1e1,\n "user": "u"}'
    assert json.loads(changed) == {**json.loads(body), "return_progress": True}


def test_with_progress_leaves_bodies_it_cannot_edit_as_bytes() -> None:
    """UTF-16 JSON and a BOM are valid requests the router cannot splice into: they go as they came."""
    utf16 = '{"model": "m", "stream": true}'.encode("utf-16-le")
    assert request.parse(utf16).stream
    assert request.with_progress(utf16) is None
    assert request.with_progress(b'\xef\xbb\xbf{"model": "m"}') is None
