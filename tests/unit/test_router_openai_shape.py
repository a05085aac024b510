"""Engine answers into OpenAI's shape (``router.openai_shape``), on plain bytes.

Error bodies of every kind an engine or a proxy writes become a valid
ErrorResponse that keeps the engine's message; llama.cpp's chunks and bodies
get their splices at the right places, whatever the spacing, the chunking and
the text in them. Every result is checked against the vendored OpenAI schemas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.router import openai_errors, openai_shape
from llmgw.router.openai_shape import Plan
from llmgw.testing import openai_schema

# -- errors --

LLAMA_MISSING = b'{"error":{"code":400,"message":"\'messages\' is required","type":"invalid_request_error"}}'
LLAMA_TYPE = (b'{"error":{"code":400,"message":"Field \'max_tokens\': [json.exception.type_error.302] type must be '
              b'number, but is string","type":"invalid_request_error"}}')
LLAMA_CONTEXT = (b'{"error":{"code":400,"message":"request (889 tokens) exceeds the available context size (512 '
                 b'tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":889,"n_ctx":512}}')
NGINX = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
         b"</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n")


def _error(status: int, body: bytes) -> dict[str, Any]:
    out = json.loads(openai_errors.error_body(status, body, replica_id="r0"))
    openai_schema.validate("error", out)
    assert set(out) == {"error"}
    return out["error"]


def test_llamacpp_errors_keep_their_message_and_gain_param_and_a_string_or_null_code() -> None:
    """An integer code (the HTTP status again) becomes null; the field the message names becomes param."""
    assert _error(400, LLAMA_MISSING) == {"message": "'messages' is required", "type": "invalid_request_error",
                                          "param": "messages", "code": None}
    typed = _error(400, LLAMA_TYPE)
    assert typed["param"] == "max_tokens" and typed["message"].startswith("Field 'max_tokens': [json.exception")
    prompt = _error(400, b'{"error":{"code":400,"message":"[json.exception.out_of_range.403] key \'prompt\' not '
                         b'found","type":"invalid_request_error"}}')
    assert prompt["param"] == "prompt"


def test_an_input_over_llamacpps_batch_is_the_clients_to_shorten() -> None:
    """llama.cpp's 500 for an embedding input longer than its physical batch (relayed as a 400 by ``upstream``):
    invalid_request_error, context_length_exceeded, param input; its words kept."""
    body = (b'{"error":{"code":500,"message":"input (201 tokens) is too large to process. increase the physical '
            b'batch size (current batch size: 64)","type":"server_error"}}')
    err = _error(400, body)
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "context_length_exceeded", "input")
    assert err["message"].startswith("input (201 tokens) is too large to process")


def test_context_overflow_gets_openais_code_and_keeps_the_engines_numbers() -> None:
    """exceed_context_size_error is OpenAI's context_length_exceeded; n_ctx and n_prompt_tokens stay."""
    err = _error(400, LLAMA_CONTEXT)
    assert err["code"] == "context_length_exceeded" and err["type"] == "exceed_context_size_error"
    assert (err["n_ctx"], err["n_prompt_tokens"]) == (512, 889) and err["message"].startswith("request (889 tokens)")


@pytest.mark.parametrize(("status", "body", "message", "type_"), [
    (500, b"Internal Server Error", "The engine (replica r0) answered HTTP 500: Internal Server Error",
     "server_error"),
    (502, NGINX, "The engine (replica r0) answered HTTP 502: 502 Bad Gateway", "server_error"),
    (500, b"<html><body><h1>Oops</h1><p>it &amp; broke</p></body></html>",
     "The engine (replica r0) answered HTTP 500: Oops it & broke", "server_error"),
    (400, b'{"error":"prompt is too long"}', "prompt is too long", "invalid_request_error"),
    (404, b'{"detail":"Not Found"}', "Not Found", "not_found_error"),
    (422, b'{"detail":[{"loc":["body","max_tokens"],"msg":"Input should be a valid integer","type":"int_parsing"}]}',
     "max_tokens: Input should be a valid integer", "invalid_request_error"),
    (400, b'{"object":"error","message":"bad n","type":"BadRequestError","param":null,"code":400}', "bad n",
     "BadRequestError"),
    (503, b"", "The engine (replica r0) answered HTTP 503 with an empty body. Retry, or check `llmgw get replicas`.",
     "server_error"),
    (500, b"  \n ", "The engine (replica r0) answered HTTP 500 with an empty body. Retry, or check "
                   "`llmgw get replicas`.", "server_error"),
    (429, b'["a", 1]', 'The engine (replica r0) answered HTTP 429: ["a", 1]', "rate_limit_error"),
    (401, b'{"error":{}}', "The engine (replica r0) answered HTTP 401: {}", "authentication_error"),
])
def test_any_error_body_becomes_a_valid_error_response_with_a_useful_message(status: int, body: bytes, message: str,
                                                                             type_: str) -> None:
    """Text, HTML pages, FastAPI's detail, a bare string, old vLLM's flat object, nothing at all."""
    err = _error(status, body)
    assert (err["message"], err["type"]) == (message, type_)


def test_fastapi_validation_errors_name_the_param_and_a_long_page_is_cut() -> None:
    """The first location's field is param; text past MAX_QUOTED characters is cut with an ellipsis."""
    err = _error(422, b'{"detail":[{"loc":["body","messages",0,"role"],"msg":"Field required"}]}')
    assert err["param"] == "messages" and err["message"] == "messages.0.role: Field required"
    long = _error(500, b"x" * 5000)["message"]
    assert long.endswith("...") and len(long) < openai_errors.MAX_QUOTED + 100


def test_an_error_already_in_shape_is_relayed_byte_for_byte() -> None:
    """A conforming engine's (the sim's, vLLM's with a string code) bytes are not re-encoded."""
    body = b'{"error": {"message": "no", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}'
    assert openai_errors.error_body(404, body, replica_id="r0") is body
    assert _error(400, b'{"error":{"message":"m","type":"t","param":null,"code":7}}')["code"] == "7"


# -- the plan --


def test_only_llamacpp_chat_and_completions_are_planned() -> None:
    """Engines that conform, and other routes, get no plan: their chunks pass untouched."""
    doc = {"model": "m", "stream": True}
    assert openai_shape.plan("vllm", "/v1/chat/completions", doc) is None
    assert openai_shape.plan("sim", "/v1/completions", doc) is None
    assert openai_shape.plan("", "/v1/chat/completions", doc) is None
    assert openai_shape.plan("llamacpp", "/v1/embeddings", doc) is None
    asked = {**doc, "logprobs": True, "stream_options": {"include_usage": True}, "prompt": ["a", "b"]}
    assert openai_shape.plan("llamacpp", "/v1/completions", asked) == Plan(chat=False, logprobs=True,
                                                                             include_usage=True, prompt_list=True)
    assert openai_shape.plan("llamacpp", "/v1/chat/completions", doc) == Plan(chat=True, logprobs=False,
                                                                                include_usage=False,
                                                                                prompt_list=False)


# vLLM 0.32's own bytes for a whole chat answer (tests/engines/test_vllm_e2e.py saw them fail the schema).
VLLM_CHAT = (b'{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,'
             b'"message":{"role":"assistant","content":"null","refusal":null,"annotations":null,"audio":null,'
             b'"function_call":null,"tool_calls":[],"reasoning":null},"logprobs":null,"finish_reason":"length",'
             b'"stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":5,'
             b'"total_tokens":9,"completion_tokens":4,"prompt_tokens_details":null},"prompt_logprobs":null,'
             b'"prompt_token_ids":null,"kv_transfer_params":null}')


def test_a_vllm_chat_answer_loses_the_keys_it_sends_as_null_and_keeps_its_text() -> None:
    """vLLM's whole chat answer drops null annotations/function_call/usage details and then conforms; chunks pass."""
    assert openai_schema.errors("chat", json.loads(VLLM_CHAT))
    plan = openai_shape.plan("vllm", "/v1/chat/completions", {"model": "tiny"})
    assert plan is not None
    doc = json.loads(plan.body(VLLM_CHAT))
    openai_schema.validate("chat", doc)
    message = doc["choices"][0]["message"]
    assert message["content"] == "null" and "annotations" not in message and "function_call" not in message
    assert doc["usage"] == {"prompt_tokens": 5, "total_tokens": 9, "completion_tokens": 4}
    assert "system_fingerprint" not in doc and doc["model"] == "tiny"
    annotated = VLLM_CHAT.replace(b'"annotations":null', b'"annotations":[]')
    assert json.loads(plan.body(annotated))["choices"][0]["message"]["annotations"] == []
    clean = json.dumps(doc).encode()
    assert plan.body(clean) is clean  # nothing to drop: the bytes pass untouched
    assert openai_shape.plan("vllm", "/v1/chat/completions", {"model": "tiny", "stream": True}) is None
    assert openai_shape.plan("vllm", "/v1/completions", {"model": "tiny"}) is None


# -- chat bodies and chunks --

CHAT_BODY = (b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"\xc3\xa9\\"'
             b'message\\":{"}}],"created":1,"model":"m","object":"chat.completion","usage":{"completion_tokens":3,'
             b'"prompt_tokens":21,"total_tokens":24},"id":"chatcmpl-1"}')


def test_a_llamacpp_chat_body_gains_logprobs_and_refusal_and_keeps_its_text() -> None:
    """Two splices on llama.cpp's bytes; content that looks like a key (escaped) is left alone."""
    before = json.loads(CHAT_BODY)
    assert openai_schema.errors("chat", before)
    out = openai_shape.chat_body(CHAT_BODY)
    doc = json.loads(out)
    openai_schema.validate("chat", doc)
    assert doc["choices"][0]["logprobs"] is None and doc["choices"][0]["message"]["refusal"] is None
    assert doc["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
    assert out.startswith(b'{"choices":[{"logprobs":null,"finish_reason"')


def test_a_chat_body_with_other_spacing_or_logprobs_is_mended_too() -> None:
    """Pretty-printed JSON takes the parsed path; a logprobs object gains its refusal."""
    pretty = json.dumps(json.loads(CHAT_BODY), indent=2).encode()
    openai_schema.validate("chat", json.loads(openai_shape.chat_body(pretty)))
    with_logprobs = CHAT_BODY.replace(b'"index":0,', b'"index":0,"logprobs":{"content":[{"id":1,"token":"a",'
                                                  b'"bytes":[97],"logprob":-1.0,"top_logprobs":[]}]},')
    assert openai_schema.errors("chat", json.loads(with_logprobs))
    doc = json.loads(openai_shape.chat_body(with_logprobs))
    openai_schema.validate("chat", doc)
    assert doc["choices"][0]["logprobs"]["refusal"] is None
    assert openai_shape.chat_body(b"not json") == b"not json"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    doc = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": 1, "id": "c",
           "model": "m", "system_fingerprint": "b0", "object": "chat.completion.chunk", **extra}
    return b"data: " + json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _events(stream: bytes) -> list[Any]:
    """Each data event's JSON (``[DONE]`` as the string), asserting the framing is whole SSE events."""
    assert stream.endswith(b"\n\n") and b"\n\n\n" not in stream
    out = []
    for event in stream[:-2].split(b"\n\n"):
        assert event.startswith(b"data:"), event
        data = event[5:].strip()
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def _shape(plan: Plan, chunks: list[bytes]) -> bytes:
    shaper = plan.shaper("r0")
    return b"".join(shaper.feed(c) for c in chunks) + shaper.end()


CHAT = Plan(chat=True, logprobs=False, include_usage=False, prompt_list=False)
STREAM = (_chunk({"role": "assistant", "content": None}) + _chunk({"content": "h\u00e9 \U0001f600 \"choices\":[{"})
          + _chunk({}, "length", timings={"n": 1}) + b"data: [DONE]\n\n")


def test_chat_chunks_gain_logprobs_null_however_the_stream_is_cut() -> None:
    """Whole, one byte at a time, or split inside a multi-byte character: the same events, each valid."""
    whole = _shape(CHAT, [STREAM])
    assert whole == STREAM.replace(b'{"choices":[{', b'{"choices":[{"logprobs":null,')
    assert _shape(CHAT, [STREAM[i:i + 1] for i in range(len(STREAM))]) == whole
    cut = STREAM.index("\U0001f600".encode()) + 2
    assert _shape(CHAT, [STREAM[:cut], STREAM[cut:]]) == whole
    events = _events(whole)
    assert events[-1] == "[DONE]" and events[1]["choices"][0]["delta"]["content"] == "h\u00e9 \U0001f600 \"choices\":[{"
    for event in events[:-1]:
        openai_schema.validate("chat_chunk", event)
        assert event["choices"][0]["logprobs"] is None


def test_chat_chunks_with_other_spacing_and_no_space_after_data() -> None:
    """``data:{ "choices" : [ {`` is found too; the bytes around it are kept."""
    odd = b'data:{ "choices" : [ { "finish_reason" : null, "index":0, "delta":{"content":"x"}}], "created":1,' \
          b' "id":"c", "model":"m", "object":"chat.completion.chunk"}\n\ndata:[DONE]\n\n'
    events = _events(_shape(CHAT, [odd]))
    assert events[0]["choices"][0]["logprobs"] is None and events[1] == "[DONE]"
    openai_schema.validate("chat_chunk", events[0])


def test_include_usage_puts_usage_null_on_every_chunk_but_the_usage_one() -> None:
    """As OpenAI streams with stream_options.include_usage; the usage chunk is left as it is."""
    plan = Plan(chat=True, logprobs=False, include_usage=True, prompt_list=False)
    usage = (b'data: {"choices":[],"created":1,"id":"c","model":"m","object":"chat.completion.chunk",'
             b'"usage":{"completion_tokens":2,"prompt_tokens":3,"total_tokens":5}}\n\n')
    for chunks in ([STREAM[:-14], usage, b"data: [DONE]\n\n"], [STREAM[:-14] + usage + b"data: [DONE]\n\n"]):
        events = _events(_shape(plan, chunks))
        assert [e["usage"] is None for e in events[:-1]] == [True, True, True, False]
        for event in events[:-1]:
            openai_schema.validate("chat_chunk", event)


def test_logprobs_objects_gain_their_refusal_and_chunks_without_get_null() -> None:
    """With logprobs asked, llama.cpp's ``{"content": [...]}`` lacks the required refusal."""
    plan = Plan(chat=True, logprobs=True, include_usage=False, prompt_list=False)
    lp = {"content": [{"id": 1, "token": "a", "bytes": [97], "logprob": -1.0, "top_logprobs": []}]}
    raw = _chunk({"content": "a"}).replace(b'"delta":{"content":"a"}}',
                                           b'"delta":{"content":"a"},"logprobs":' + json.dumps(lp).encode() + b"}")
    assert openai_schema.errors("chat_chunk", json.loads(raw[6:]))
    events = _events(_shape(plan, [raw + _chunk({}, "stop")]))
    assert events[0]["choices"][0]["logprobs"] == {**lp, "refusal": None}
    assert events[1]["choices"][0]["logprobs"] is None
    for event in events:
        openai_schema.validate("chat_chunk", event)


def test_an_error_event_inside_a_stream_is_rewritten() -> None:
    """llama.cpp's ``data: {"error": {"code": 500, ...}}`` after the first token becomes an ErrorResponse."""
    raw = _chunk({"content": "a"}) + b'data: {"error":{"code":500,"message":"decode failed","type":"server_error"}}\n\n'
    events = _events(_shape(CHAT, [raw]))
    openai_schema.validate("error", events[1])
    assert events[1]["error"] == {"message": "decode failed", "type": "server_error", "param": None, "code": None}


def test_a_last_line_without_its_newline_is_flushed_at_the_end() -> None:
    """A stream cut mid-line still delivers its bytes, spliced, when the stream ends."""
    shaper = CHAT.shaper("r0")
    assert shaper.feed(b'data: {"choices":[{"index":0') == b""
    assert shaper.end() == b'data: {"choices":[{"logprobs":null,"index":0'
    assert shaper.end() == b""


# -- completions --

COMPLETION = Plan(chat=False, logprobs=False, include_usage=False, prompt_list=False)


def _text(text: str, finish: str | None = None, index: int = 0, **extra: Any) -> bytes:
    doc = {"choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}], "created": 1,
           "model": "m", "system_fingerprint": "b0", "object": "text_completion", **extra, "id": "c"}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


USAGE = {"completion_tokens": 2, "prompt_tokens": 2, "total_tokens": 4}


def test_completions_chunks_pass_unchanged_without_include_usage() -> None:
    """llama.cpp's completions chunks already validate; without include_usage nothing is touched."""
    raw = _text("a") + _text("", "length", usage=USAGE) + b"data: [DONE]\n\n"
    shaper = COMPLETION.shaper("r0")
    assert shaper.feed(raw) == raw and shaper.feed(raw[:40]) + shaper.feed(raw[40:]) == raw


def test_include_usage_moves_completions_usage_to_a_final_empty_choices_chunk() -> None:
    """The usage leaves the last choice's chunk for a ``"choices": []`` one, as OpenAI sends it."""
    plan = Plan(chat=False, logprobs=False, include_usage=True, prompt_list=False)
    events = _events(_shape(plan, [_text("a"), _text("", "length", usage=USAGE, timings={"n": 1}),
                                   b"data: [DONE]\n\n"]))
    assert [e["usage"] for e in events[:-1]] == [None, None, USAGE]
    assert events[2]["choices"] == [] and events[2]["id"] == "c"
    assert events[1]["choices"][0]["finish_reason"] == "length"
    for event in events[:-1]:
        openai_schema.validate("completion_chunk", event)


def test_llamacpps_data_null_for_a_list_of_prompts_is_dropped() -> None:
    """``data: null`` (not an object) starts llama.cpp's stream for several prompts; the rest stays."""
    plan = Plan(chat=False, logprobs=False, include_usage=False, prompt_list=True)
    raw = b"data: null\n\n" + _text("a") + _text("b", index=1) + b"data: [DONE]\n\n"
    out = _shape(plan, [raw])
    assert out == raw[len(b"data: null\n\n"):]
    assert _shape(plan, [b"data: null\n", b"\n" + _text("a")]) == _text("a")


def test_several_events_in_one_chunk_are_spliced_even_when_text_says_data() -> None:
    """Events read together get one splice each; content containing "data:" takes the slower way, same bytes."""
    plain = _chunk({"content": "a"}) * 3 + b"data: [DONE]\n\n"
    tricky = _chunk({"content": "a"}) + _chunk({"content": 'data: {"x"'}) + b"data: [DONE]\n\n"
    for raw in (plain, tricky):
        assert _shape(CHAT, [raw]) == raw.replace(b'{"choices":[{', b'{"choices":[{"logprobs":null,')


# -- one created per stream, on llama.cpp's own bytes --

#: Streams recorded from xllamacpp 2026.10 (SmolLM2-135M, 100-120 tokens at temperature 0), cut to the
#: events around each change of second; llama.cpp stamps every chunk with the second it wrote it.
LLAMACPP_SSE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_sse"


def _created(stream: bytes) -> list[int]:
    return [e["created"] for e in _events(stream) if isinstance(e, dict)]


def _cuts(raw: bytes) -> list[list[bytes]]:
    """The stream as llama.cpp sends it (an event a read), all at once, cut at arbitrary bytes, and its first and
    last events read several at once (the last ones: of a later second, after one such was seen alone)."""
    events = [e + b"\n\n" for e in raw[:-2].split(b"\n\n")]
    return [events, [raw], [raw[i:i + 97] for i in range(0, len(raw), 97)],
            [b"".join(events[:3]), *events[3:]], [*events[:-4], b"".join(events[-4:])]]


@pytest.mark.parametrize(("name", "plan", "schema"), [
    ("chat.sse", CHAT, "chat_chunk"),
    ("chat.sse", Plan(chat=True, logprobs=True, include_usage=False, prompt_list=False), "chat_chunk"),
    ("chat_include_usage.sse", Plan(chat=True, logprobs=False, include_usage=True, prompt_list=False), "chat_chunk"),
    ("completion.sse", COMPLETION, "completion_chunk"),
    ("completion.sse", Plan(chat=False, logprobs=False, include_usage=True, prompt_list=False), "completion_chunk"),
])
def test_every_chunk_of_a_llamacpp_stream_carries_its_first_created(name: str, plan: Plan, schema: str) -> None:
    """llama.cpp's created changes mid-stream; out of the router every event has the first one, whatever the
    reads, and nothing else in the events changes but the splices."""
    raw = (LLAMACPP_SSE / name).read_bytes()
    before = _created(raw)
    assert len(set(before)) > 1, "the recording must cross a second"
    outs = [_shape(plan, chunks) for chunks in _cuts(raw)]
    assert all(out == outs[0] for out in outs)
    events = [e for e in _events(outs[0]) if isinstance(e, dict)]
    assert {e["created"] for e in events} == {before[0]}
    for event in events:
        openai_schema.validate(schema, event)
    texts = [c.get("text") or (c.get("delta") or {}).get("content") for e in events for c in e["choices"]]
    assert texts == [c.get("text") or (c.get("delta") or {}).get("content") for e in _events(raw)
                     if isinstance(e, dict) for c in e["choices"]]


def test_created_with_other_spacing_is_the_first_too() -> None:
    """An event not written as llama.cpp writes it takes the line-by-line way and is stamped all the same."""
    first = _chunk({"content": "a"}).replace(b'"created":1', b'"created":1796160739')
    odd = (b'data: { "choices": [ { "index": 0, "delta": {"content": "b"}}], "created" : 1796160741,'
           b' "id": "c", "object": "chat.completion.chunk", "model": "m"}\n\n')
    usual = _chunk({"content": "c"}).replace(b'"created":1', b'"created":1796160742')
    assert _created(_shape(CHAT, [first, odd, usual, b"data: [DONE]\n\n"])) == [1796160739] * 3
    # The first event may be the odd one: its created is the stream's.
    assert _created(_shape(CHAT, [odd, first, usual])) == [1796160741] * 3
