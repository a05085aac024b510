"""The router's API surface end to end: embeddings, responses, aliases, limits, exact bodies, keep-alive, /metrics.

A router process runs over a static table in front of real HTTP upstreams on
127.0.0.1: sim engines, and ``Recorder``, a small aiohttp server written here
that keeps every body it receives and answers embeddings and responses, which
the sim does not serve.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from llmgw.testing import openai_schema
from llmgw.testing.routed import Procs, started
from llmgw.testing.threaded import ThreadedApp

EMBEDDING = {"object": "list", "model": "emb-served",
             "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 1.0]}],
             "usage": {"prompt_tokens": 2, "total_tokens": 2}}
RESPONSE = {"id": "resp_1", "object": "response", "created_at": 0, "status": "completed", "model": "resp-served",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "hi", "annotations": []}]}]}
RESPONSE_EVENTS = (b'event: response.created\ndata: {"type":"response.created"}\n\n'
                   b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'
                   b'event: response.completed\ndata: {"type":"response.completed"}\n\n')


class Recorder(ThreadedApp):
    """An upstream in a thread that records (path, body) of every request and answers in OpenAI's shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[tuple[str, bytes]] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append((request.path, body))
        if request.path == "/v1/embeddings":
            return web.json_response(EMBEDDING)
        if request.path == "/v1/responses" and json.loads(body).get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in RESPONSE_EVENTS.split(b"\n\n")[:-1]:
                await response.write(event + b"\n\n")
            await response.write_eof()
            return response
        if request.path == "/v1/responses":
            return web.json_response(RESPONSE)
        return web.json_response({"id": "x", "object": "text_completion", "created": 0, "model": "m",
                                  "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "stop"}]})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{tail:.*}", self._handle)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with started(tmp_path) as p:
        yield p


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


def model(name: str, url: str, *, served_name: str | None = None, aliases: tuple[str, ...] = (),
          replica: str = "r-1") -> dict[str, Any]:
    return {"name": name, "served_name": served_name or name, "aliases": list(aliases), "state": "Ready",
            "endpoints": [{"replica_id": replica, "url": url, "api_key": ""}]}


def client(router: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router + "/v1", api_key="k", max_retries=0, timeout=30)


def test_embeddings_are_forwarded_by_alias(procs: Procs, recorder: Recorder) -> None:
    """An embeddings request by alias reaches the engine under its served name; the answer is relayed as is."""
    router = procs.router([model("emb", recorder.url, served_name="emb-served", aliases=("embedder",))])
    raw = client(router).embeddings.with_raw_response.create(model="embedder", input="hello",
                                                             encoding_format="float")
    assert raw.headers["x-llmgw-upstream"] == "r-1" and float(raw.headers["x-llmgw-overhead-ms"]) >= 0
    assert json.loads(raw.content) == EMBEDDING
    openai_schema.validate("embedding", json.loads(raw.content))
    path, body = recorder.bodies[-1]
    assert path == "/v1/embeddings" and json.loads(body)["model"] == "emb-served"


def test_responses_whole_and_streamed_are_relayed_byte_for_byte(procs: Procs, recorder: Recorder) -> None:
    """/v1/responses, whole and streamed: the client gets exactly the engine's bytes."""
    router = procs.router([model("resp-served", recorder.url)])
    whole = httpx.post(router + "/v1/responses", json={"model": "resp-served", "input": "hi"})
    assert whole.status_code == 200 and whole.json() == RESPONSE
    with httpx.stream("POST", router + "/v1/responses",
                      json={"model": "resp-served", "input": "hi", "stream": True}) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert b"".join(streamed.iter_raw()) == RESPONSE_EVENTS
    assert [p for p, _ in recorder.bodies] == ["/v1/responses", "/v1/responses"]


def test_engine_receives_the_clients_bytes(procs: Procs, recorder: Recorder) -> None:
    """The body reaches the engine byte for byte (odd spacing, 1e3, user, max_tokens, stream_options); by
    alias, only the model's value differs."""
    router = procs.router([model("m", recorder.url, served_name="m-served", aliases=("alias",))])
    template = ('{ "model" :"%s",  "prompt":"h\\u00e9llo ünï", "max_tokens": 1e3, "user": "u-7",'
                ' "stream_options": {"include_usage": true}, "logit_bias": {"50256": -100} }')
    for sent, expected in (("m-served", "m-served"), ("alias", "m-served")):
        body = (template % sent).encode()
        response = httpx.post(router + "/v1/completions", content=body,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        assert recorder.bodies[-1] == ("/v1/completions", (template % expected).encode())


def test_aliases_route_and_are_listed_once(procs: Procs) -> None:
    """Every served name and alias routes and is listed once, even a name two models claim."""
    sim = procs.sim("qwen2.5-0.5b")
    router = procs.router([model("qwen", sim, served_name="qwen2.5-0.5b", aliases=("small", "qwen-small")),
                           model("other", sim, aliases=("small",), replica="r-2")])
    listing = httpx.get(router + "/v1/models").json()
    openai_schema.validate("models", listing)
    assert [m["id"] for m in listing["data"]] == ["qwen2.5-0.5b", "small", "qwen-small", "other"]
    c = client(router)
    for name in ("qwen2.5-0.5b", "small", "qwen-small", "qwen"):
        assert c.completions.create(model=name, prompt="x", max_tokens=1).model == "qwen2.5-0.5b"
    usage = list(c.chat.completions.create(model="small", messages=[{"role": "user", "content": "x"}],
                                           max_tokens=2, stream=True, stream_options={"include_usage": True}))
    assert usage[-1].usage is not None and usage[-1].usage.completion_tokens == 2


def test_body_limit_413_and_malformed_400(procs: Procs, recorder: Recorder) -> None:
    """Past --max-body-bytes a 413 names the limit and the flag; malformed JSON is a 400; both OpenAI-shaped."""
    router = procs.router([model("m", recorder.url)], "--max-body-bytes", "2000")
    big = httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "x" * 3000})
    assert big.status_code == 413
    openai_schema.validate("error", big.json())
    assert "2000 bytes" in big.json()["error"]["message"] and "--max-body-bytes" in big.json()["error"]["message"]
    bad = httpx.post(router + "/v1/embeddings", content=b"{nope", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400
    openai_schema.validate("error", bad.json())
    assert httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "x" * 100}).status_code == 200
    assert not any(len(body) > 2000 for _, body in recorder.bodies)


def test_keepalive_comments_while_the_first_token_is_slow(procs: Procs) -> None:
    """A 1 s prefill with --keepalive 0.2: comments go out before the first data event, and clients ignore them."""
    sim = procs.sim("slow", "--prefill-tps", "2")  # an 8-character prompt: 2 tokens, 1 s to the first token
    router = procs.router([model("slow", sim)], "--keepalive", "0.2")
    with httpx.stream("POST", router + "/v1/completions",
                      json={"model": "slow", "prompt": "abcdefgh", "max_tokens": 2, "stream": True}) as response:
        raw = b"".join(response.iter_raw())
    head, _, rest = raw.partition(b"data: ")
    assert head.count(b": keep-alive\n\n") >= 3 and head == b": keep-alive\n\n" * head.count(b": keep-alive\n\n")
    assert rest.endswith(b"[DONE]\n\n")
    pieces = list(client(router).completions.create(model="slow", prompt="abcd", max_tokens=2, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == " tok0 tok1"


def test_metrics_after_a_few_requests(procs: Procs) -> None:
    """/metrics carries requests by model, replica and code, and TTFT, gap, duration and overhead series."""
    sim = procs.sim("m")
    router = procs.router([model("m", sim, aliases=("m-alias",), replica="r-7")])
    c = client(router)
    for _ in range(2):
        assert list(c.completions.create(model="m-alias", prompt="x", max_tokens=3, stream=True))
    c.completions.create(model="m", prompt="x", max_tokens=1)
    httpx.post(router + "/v1/completions", json={"model": "nope", "prompt": "x"})
    text = httpx.get(router + "/metrics").text
    assert 'llmgw_router_requests_total{code="200",model="m",replica="r-7"} 3.0' in text
    assert 'llmgw_router_requests_total{code="404",model="",replica=""} 1.0' in text
    assert 'llmgw_router_time_to_first_token_seconds_count{model="m"} 2.0' in text
    assert 'llmgw_router_inter_token_latency_seconds_count{model="m"}' in text
    assert 'llmgw_router_request_duration_seconds_count{model="m"} 3.0' in text
    assert "llmgw_router_overhead_seconds_count 3.0" in text
    assert 'llmgw_router_requests_in_flight{model="m"} 0.0' in text
    assert "llmgw_router_queued_requests 0.0" in text
