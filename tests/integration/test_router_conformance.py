"""Through the router, every answer is OpenAI's shape: llama.cpp's bodies and chunks, and any engine's errors.

A real llama.cpp engine (the xllamacpp launcher on the tiny GGUF) behind a
standalone router: every body and every SSE chunk of chat and completions,
streamed or not, validates against the vendored schemas, and so do its error
answers on all four routes. A fake upstream written here answers with what no
engine should (text, an HTML page, ``{"error": "..."}``, FastAPI's ``detail``,
nothing) and with an error event inside a stream: each reaches the client as a
valid ErrorResponse that says what happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from llmgw.testing import openai_schema, tiny_gguf
from llmgw.testing.procs import Proc, free_port
from llmgw.testing.routed import Procs, started
from llmgw.testing.threaded import ThreadedApp

MESSAGES = [{"role": "user", "content": "hi"}]
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


def _model(engine: str, url: str) -> dict[str, Any]:
    return {"name": "m", "state": "Ready", "engine": engine, "routing": "round_robin",
            "endpoints": [{"replica_id": "r0", "url": url}]}


def _events(text: str) -> list[Any]:
    """The data of each SSE event (``[DONE]`` as the string); keep-alive comments skipped."""
    out = []
    for event in text.split("\n\n"):
        if not event.strip() or event.startswith(":"):
            continue
        assert event.startswith("data:"), event
        data = event[5:].strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _post(url: str, path: str, doc: dict[str, Any] | bytes) -> httpx.Response:
    content = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return httpx.post(url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router (engine: llamacpp) in front of a real llama.cpp engine; the router's URL."""
    tmp = tmp_path_factory.mktemp("llama")
    model = tiny_gguf.write_tiny_llama_gguf(tmp / "tiny.gguf")
    port = free_port()
    engine = Proc.start([sys.executable, "-m", "llmgw.agent.engines.llamacpp_launcher", "--model", str(model),
                         "--port", str(port), "--alias", "m", "--threads", "1", "--parallel", "2",
                         "--ctx-size", "512"], env=dict(os.environ), log_path=tmp / "engine.log")
    try:
        engine.wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        with started(tmp) as procs:
            yield procs.router([_model("llamacpp", f"http://127.0.0.1:{port}")])
    finally:
        engine.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("options", [{}, {"logprobs": True}, {"stream_options": {"include_usage": True}},
                                     {"logprobs": True, "stream_options": {"include_usage": True}}],
                         ids=["plain", "logprobs", "include_usage", "both"])
def test_every_llamacpp_body_and_chunk_validates(llama: str, path: str, options: dict[str, Any]) -> None:
    """Chat and completions, whole and streamed, with and without logprobs and include_usage."""
    chat = path == "/v1/chat/completions"
    kind = "chat" if chat else "completion"
    doc: dict[str, Any] = {"model": "m", "max_tokens": 4, "temperature": 0,
                           **({"messages": MESSAGES} if chat else {"prompt": "hi"})}
    if options.get("logprobs"):
        doc.update({"logprobs": True, "top_logprobs": 1} if chat else {"logprobs": 1})
    if "stream_options" not in options:
        whole = _post(llama, path, doc)
        assert whole.status_code == 200, whole.text
        openai_schema.validate(kind, whole.json())
    streamed = _post(llama, path, {**doc, "stream": True, **options})
    assert streamed.status_code == 200, streamed.text
    events = _events(streamed.text)
    assert events[-1] == "[DONE]" and len(events) >= 3
    for event in events[:-1]:
        openai_schema.validate(f"{kind}_chunk", event)
    if "stream_options" in options:  # OpenAI's: usage null on every chunk, then one with the usage and no choices
        assert [e["usage"] is None for e in events[:-1]] == [True] * (len(events) - 2) + [False]
        assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 4
    else:
        assert all(c.get("logprobs", "absent") != "absent" for e in events[:-1] for c in e["choices"])


def test_a_list_of_prompts_streams_valid_chunks_only(llama: str) -> None:
    """llama.cpp starts that stream with ``data: null``; the client never sees it."""
    got = _post(llama, "/v1/completions", {"model": "m", "prompt": ["hi", "yo"], "max_tokens": 2, "stream": True})
    events = _events(got.text)
    assert None not in events and {c["index"] for e in events[:-1] for c in e["choices"]} == {0, 1}
    for event in events[:-1]:
        openai_schema.validate("completion_chunk", event)


@pytest.mark.parametrize(("path", "doc", "status", "param"), [
    ("/v1/chat/completions", {"max_tokens": 3}, 400, "messages"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": "eight"}, 400, "max_tokens"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/embeddings", {"input": "hi"}, 501, None),
    ("/v1/responses", {}, 400, "input"),
], ids=["no-messages", "max-tokens-eight", "no-prompt", "embeddings-off", "no-input"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_llamacpp_errors_are_openais_shape_on_every_route(llama: str, path: str, doc: dict[str, Any], status: int,
                                                          param: str | None, stream: bool) -> None:
    """The engine's status and message stay; code is null or a string, param is the field at fault."""
    body = {"model": "m", **doc, **({"stream": True} if stream else {})}
    got = _post(llama, path, body)
    assert got.status_code == status and got.headers["content-type"].startswith("application/json")
    openai_schema.validate("error", got.json())
    assert got.json()["error"]["param"] == param and got.json()["error"]["code"] is None


def test_llamacpp_context_overflow_says_context_length_exceeded(llama: str) -> None:
    """OpenAI's code for a prompt over the context, which clients look for to trim a conversation."""
    got = _post(llama, "/v1/completions", {"model": "m", "prompt": " ".join(f"w{i}" for i in range(300)),
                                           "max_tokens": 2, "stream": True})
    assert got.status_code == 400
    openai_schema.validate("error", got.json())
    assert got.json()["error"]["code"] == "context_length_exceeded"


def test_llamacpp_embeds_through_the_router_and_an_input_over_its_batch_is_a_400(tmp_path: Path) -> None:
    """A llama.cpp engine started with --embeddings (batch 16): an input that fits is embedded, one that does
    not is the client's 400 context_length_exceeded (llama.cpp says 500), and repeating it ejects nothing."""
    model = tiny_gguf.write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    port = free_port()
    engine = Proc.start([sys.executable, "-m", "llmgw.agent.engines.llamacpp_launcher", "--model", str(model),
                         "--port", str(port), "--alias", "m", "--threads", "1", "--ctx-size", "512",
                         "--batch-size", "16", "--embeddings", "--pooling", "mean"], env=dict(os.environ),
                        log_path=tmp_path / "engine.log")
    try:
        engine.wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        with started(tmp_path) as procs:
            router = procs.router([{**_model("llamacpp", f"http://127.0.0.1:{port}"), "embeddings": True}])
            got = _post(router, "/v1/embeddings", {"model": "m", "input": "a b c", "encoding_format": "float"})
            assert got.status_code == 200, got.text
            openai_schema.validate("embedding", got.json())
            assert len(got.json()["data"][0]["embedding"]) == tiny_gguf.N_EMBD
            for _ in range(4):  # past the ejection threshold (3 in a row)
                long = _post(router, "/v1/embeddings", {"model": "m", "input": " ".join(["a"] * 40)})
                assert long.status_code == 400, long.text
                openai_schema.validate("error", long.json())
                error = long.json()["error"]
                assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
                assert "is too large to process" in error["message"]
            assert "ejected" not in procs.procs[-1].log_tail(200)
            assert _post(router, "/v1/chat/completions", {"model": "m", "messages": MESSAGES,
                                                          "max_tokens": 2}).status_code == 200
    finally:
        engine.stop()


# -- a fake upstream writing what no engine should --

#: case name -> (status, content type, body); the request's "case" field picks one.
CASES: dict[str, tuple[int, str, bytes]] = {
    "text": (500, "text/plain", b"Internal Server Error"),
    "html": (500, "text/html", b"<html><head><title>500 Internal Server Error</title></head><body><h1>500</h1>"
                               b"<p>upstream crashed</p></body></html>"),
    "html502": (502, "text/html", b"<html><head><title>502 Bad Gateway</title></head><body><center>nginx"
                                  b"</center></body></html>"),
    "string": (400, "application/json", b'{"error":"prompt is too long"}'),
    "detail": (422, "application/json", b'{"detail":[{"loc":["body","max_tokens"],"msg":"Input should be a valid '
                                        b'integer","type":"int_parsing"}]}'),
    "empty": (500, "application/json", b""),
}
MESSAGES_SEEN = {"text": "Internal Server Error", "html": "500 Internal Server Error", "html502": "502 Bad Gateway",
                 "string": "prompt is too long", "detail": "max_tokens: Input should be a valid integer",
                 "empty": "empty body"}


class Misbehaving(ThreadedApp):
    """Answers every route with ``CASES[doc["case"]]``; case "midstream" streams a token, then an error event."""

    def routes(self, app: web.Application) -> None:
        for path in ROUTES:
            app.router.add_post(path, self._answer)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        doc = json.loads(await request.read())
        if doc["case"] == "midstream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],'
                             b'"created":1,"id":"c","model":"m","object":"chat.completion.chunk"}\n\n')
            await resp.write(b'data: {"error":{"code":500,"message":"Could not decode","type":"server_error"}}\n\n')
            return resp
        status, content_type, body = CASES[doc["case"]]
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with started(tmp_path) as p:
        yield p


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_any_error_body_reaches_the_client_as_a_valid_error_response(procs: Procs, engine: str) -> None:
    """Every case, on every route, whole and streamed, for a normalised engine and one that is not."""
    with Misbehaving() as upstream:
        router = procs.router([_model(engine, upstream.url)])
        for path in ROUTES:
            for case, (status, _, _) in CASES.items():
                for stream in (False, True):
                    got = _post(router, path, {"model": "m", "case": case, "stream": stream, "prompt": "x"})
                    where = f"{path} {case} stream={stream}: {got.text}"
                    # A 502 is retried on the next replica; with none left, the router's own 502 lists it.
                    assert got.status_code == status, where
                    openai_schema.validate("error", got.json())
                    assert MESSAGES_SEEN[case] in got.json()["error"]["message"], where
                    assert "<" not in got.json()["error"]["message"], where


def test_an_error_answered_after_the_keepalive_200_is_an_error_response_event(procs: Procs) -> None:
    """The stream's status went out with the first keep-alive; the engine's error is its last event."""
    class Slow(Misbehaving):
        async def _answer(self, request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(0.4)
            return await super()._answer(request)

    with Slow() as upstream:
        router = procs.router([_model("llamacpp", upstream.url)], "--keepalive", "0.1")
        got = _post(router, "/v1/chat/completions", {"model": "m", "case": "detail", "stream": True})
        assert got.status_code == 200 and got.text.startswith(": keep-alive")
        events = _events(got.text)
        openai_schema.validate("error", events[-1])
        assert events[-1]["error"]["param"] == "max_tokens"


def test_an_error_event_inside_a_llamacpp_stream_is_rewritten(procs: Procs) -> None:
    """llama.cpp's ``data: {"error": {"code": 500, ...}}`` after a token reaches the client as an ErrorResponse."""
    with Misbehaving() as upstream:
        router = procs.router([_model("llamacpp", upstream.url)])
        got = _post(router, "/v1/chat/completions", {"model": "m", "case": "midstream", "stream": True})
        events = _events(got.text)
        openai_schema.validate("chat_chunk", events[0])
        openai_schema.validate("error", events[1])
        assert events[1]["error"]["message"] == "Could not decode" and events[1]["error"]["code"] is None
