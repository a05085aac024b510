"""The router asks llama.cpp for prefill progress, so a client leaving during a prefill stops it there.

llama.cpp notices a client that left only when it next writes to it, and during a
prefill it writes nothing: a stream whose client left keeps the engine's slot
until the prefill ends. The router adds ``"return_progress": true`` to streams
for models whose engine is llamacpp; the engine then writes an event after each
prefill batch, the router drops those events, and a client's disconnect (the
router closes the upstream connection) fails the next one.

An upstream written here plays llama.cpp's stream exactly (its progress events
are the ones xllamacpp 2026.10 sends) for what the router does to bytes; the
last test runs the real engine.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from llmgw.testing.models import smollm2_gguf
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.routed import Procs, started
from llmgw.testing.threaded import ThreadedApp


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], **extra: Any) -> bytes:
    return _event({"choices": [{"finish_reason": None, "index": 0, "delta": delta}], "model": "m",
                   "object": "chat.completion.chunk", "id": "chatcmpl-1", "created": 1, **extra})


class LlamaLike(ThreadedApp):
    """A chat endpoint streaming as llama.cpp does: progress events when asked, then the tokens.

    ``crash``: after the progress events, the connection is cut (an engine dying mid-prefill).
    """

    def __init__(self, *, crash: bool = False) -> None:
        super().__init__()
        self.crash = crash
        self.bodies: list[bytes] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(body)
        doc = json.loads(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if doc.get("return_progress"):
            for done in (0, 64, 96):  # one write per prefill batch, as the engine does
                await resp.write(_chunk({"role": "assistant", "content": None},
                                        prompt_progress={"total": 96, "cache": 0, "processed": done,
                                                         "time_ms": done * 4}))
                await asyncio.sleep(0.01)
        if self.crash:
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write(_chunk({"role": "assistant", "content": None}))
        for word in ("one", " two", " three"):
            await resp.write(_chunk({"content": word}))
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _model(engine: str, *urls: str, routing: str = "round_robin") -> dict[str, Any]:
    return {"name": "m", "state": "Ready", "engine": engine, "routing": routing,
            "endpoints": [{"replica_id": f"r{i}", "url": u} for i, u in enumerate(urls)]}


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with started(tmp_path) as p:
        yield p


BODY = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


def _post(router: str, body: bytes) -> bytes:
    r = httpx.post(router + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"},
                   timeout=30)
    assert r.status_code == 200, r.text
    return r.content


def test_progress_is_asked_of_llamacpp_and_never_reaches_the_client(procs: Procs) -> None:
    """The engine gets the field in front of the client's bytes; the client gets no progress event."""
    with LlamaLike() as engine:
        router = procs.router([_model("llamacpp", engine.url)])
        got = _post(router, BODY)
        assert engine.bodies == [b'{"return_progress":true,' + BODY[1:]]
        assert b"prompt_progress" not in got
        assert got.count(b"data: ") == 5 and got.endswith(b"data: [DONE]\n\n")
        stream = openai.OpenAI(base_url=router + "/v1", api_key="x").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "one two three"


@pytest.mark.parametrize(("engine_name", "body"), [
    ("vllm", BODY),  # another engine: nothing added
    ("", BODY),  # a table that does not say
    ("llamacpp", BODY.replace(b'"stream": true', b'"stream": false')),  # not a stream: nothing to write during it
])
def test_other_requests_reach_the_engine_as_sent(procs: Procs, engine_name: str, body: bytes) -> None:
    with LlamaLike() as engine:
        router = procs.router([_model(engine_name, engine.url)])
        httpx.post(router + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"},
                   timeout=30)
        assert engine.bodies == [body]


def test_a_client_that_asked_for_progress_gets_it(procs: Procs) -> None:
    """The client's own return_progress is left alone, and so are the events it asked for."""
    body = BODY.replace(b'"stream": true', b'"stream": true, "return_progress": true')
    with LlamaLike() as engine:
        router = procs.router([_model("llamacpp", engine.url)])
        got = _post(router, body)
        assert engine.bodies == [body]
        assert got.count(b"prompt_progress") == 3


def test_an_engine_failing_during_the_prefill_is_retried_elsewhere(procs: Procs) -> None:
    """Progress events are no bytes to the client: a stream cut among them goes to the next replica."""
    with LlamaLike(crash=True) as broken, LlamaLike() as good:
        router = procs.router([_model("llamacpp", broken.url, good.url)])
        for _ in range(4):  # round robin: the broken replica is some requests' first choice
            got = _post(router, BODY)
            assert b"prompt_progress" not in got and b'"content":" three"' in got
        assert broken.bodies, "the broken replica was never tried"
        assert len(good.bodies) == 4


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    assert match, f"{name} not in the engine's /metrics"
    return float(match.group(1))


def _processing(url: str) -> bool:
    return any(s.get("is_processing") for s in httpx.get(url + "/slots", timeout=10).json())


def test_llamacpp_stops_a_prefill_whose_client_left(procs: Procs, tmp_path: Path) -> None:
    """The real engine: a client that leaves during a long prefill, through the router, stops it part way.

    Batches of 16 tokens on one thread: a ~500-token prompt takes seconds to prefill. Without the
    router's progress events the engine would evaluate every prompt token before noticing.
    """
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    procs.procs.append(Proc.start(
        [sys.executable, "-m", "llmgw.agent.engines.llamacpp_launcher", "--model", str(smollm2_gguf()),
         "--port", str(port), "--alias", "m", "--threads", "1", "--parallel", "1", "--ctx-size", "2048",
         "--batch-size", "16", "--metrics"], log_path=tmp_path / "engine.log"))
    procs.procs[-1].wait_http(engine + "/health", timeout=60)
    router = procs.router([_model("llamacpp", engine)])
    prompt = " ".join(f"word{i % 89} value{i % 13}." for i in range(120))
    tokens = len(httpx.post(engine + "/tokenize", json={"content": prompt}, timeout=10).json()["tokens"])
    assert tokens > 400
    before = _counter(engine, "llamacpp:prompt_tokens_total")
    data = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 5, "stream": True, "temperature": 0}).encode()
    # A raw socket: an HTTP client would wait for the response's headers, which come with the first token.
    with socket.create_connection(("127.0.0.1", int(router.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        wait_for(lambda: _processing(engine), timeout=20, what="the engine to start the prefill")
        time.sleep(0.3)  # a few batches in
    wait_for(lambda: not _processing(engine), timeout=30, what="the engine to stop")
    evaluated = _counter(engine, "llamacpp:prompt_tokens_total") - before
    assert 0 < evaluated < tokens / 2, f"{evaluated:.0f} of {tokens} prompt tokens were evaluated"
