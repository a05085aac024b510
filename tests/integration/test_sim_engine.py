"""The sim engine as a process: OpenAI-valid answers to the real client, auth, aborts and a prompt exit."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.agent import engines
from llmgw.core import shards
from llmgw.testing import openai_schema, procs

KEY = "sk-sim-test"
MODEL = "sim-model"


def start_sim(tmp_path: Path, name: str, *args: str) -> tuple[procs.Proc, str]:
    """Start a sim engine through its adapter's argv; return it and its base URL once healthy."""
    spec = shards.ShardSpec(shard_id=name, replica_id="r", model=MODEL, engine="sim", served_name=MODEL,
                            api_key=KEY, args=args)
    port = procs.free_port()
    launch = engines.get("sim").launch(spec, host="127.0.0.1", port=port, model_path=None, cpu_count=2,
                                       python=sys.executable)
    # The key is in the adapter's env (never on argv), so the env goes along.
    proc = procs.Proc.start(launch.argv, env={**os.environ, **launch.env}, log_path=tmp_path / f"{name}.log")
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A quick sim engine shared by the protocol tests."""
    proc, url = start_sim(tmp_path_factory.mktemp("sim"), "fast", "--decode-tps", "2000")
    try:
        proc.wait_http(url + "/health", timeout=20)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A sim engine with one slot at 20 tokens/s, so requests are easy to catch mid-flight."""
    proc, url = start_sim(tmp_path_factory.mktemp("sim"), "slow", "--decode-tps", "20", "--parallel", "1",
                          "--max-tokens-default", "200")
    try:
        proc.wait_http(url + "/health", timeout=20)
        yield url
    finally:
        proc.stop()


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10)


def sse_chunks(lines: Iterator[str]) -> list[Any]:
    """The JSON chunks of an SSE stream; asserts it ends with [DONE]."""
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", data[-3:]
    return [json.loads(d) for d in data[:-1]]


def get_json(url: str, *, key: str | None = KEY, body: bytes | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stats(url: str) -> dict[str, Any]:
    return get_json(url + "/sim/stats", key=None)[1]


def test_models_lists_the_served_model(fast: str) -> None:
    """GET /v1/models is a valid OpenAI list naming the one model, and the SDK reads it."""
    status, body = get_json(fast + "/v1/models")
    assert status == 200
    openai_schema.validate("models", body)
    assert [m.id for m in client(fast).models.list()] == [MODEL]


def test_chat_completion(fast: str) -> None:
    """A non-streaming chat answer validates and carries deterministic text and usage."""
    raw = client(fast).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x" * 40}], max_tokens=3)
    openai_schema.validate("chat", json.loads(raw.text))
    parsed = raw.parse()
    assert parsed.choices[0].message.content == " tok0 tok1 tok2"
    assert parsed.choices[0].finish_reason == "length"
    assert parsed.usage is not None
    assert (parsed.usage.prompt_tokens, parsed.usage.completion_tokens) == (10, 3)


def test_chat_stream_with_usage(fast: str) -> None:
    """Every streamed chat chunk validates; the last before [DONE] has no choices and the usage."""
    with client(fast).chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_completion_tokens=4,
            stream=True, stream_options={"include_usage": True}) as response:
        chunks = sse_chunks(response.iter_lines())
    for chunk in chunks:
        openai_schema.validate("chat_chunk", chunk)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == " tok0 tok1 tok2 tok3"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    # And the SDK's own stream parser reads it.
    stream = client(fast).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == " tok0 tok1"


def test_echo_answers_the_last_user_message_and_stats_list_the_bodies(tmp_path: Path) -> None:
    """With --echo a chat's answer is its last user message, a word a token (newlines kept), "stop" when whole
    and "length" when max_tokens cuts it; /sim/stats lists the bodies as received, history and parameters."""
    proc, url = start_sim(tmp_path, "echo", "--echo", "--decode-tps", "2000")
    try:
        proc.wait_http(url + "/health", timeout=20)
        history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
                   {"role": "assistant", "content": "first"},
                   {"role": "user", "content": "two words\n\n```\ncode\n```"}]
        whole = client(url).chat.completions.create(model=MODEL, messages=history, max_tokens=50)  # type: ignore[arg-type]
        assert whole.choices[0].message.content == "two words\n\n```\ncode\n```"
        assert whole.choices[0].finish_reason == "stop"
        with client(url).chat.completions.with_streaming_response.create(
                model=MODEL, messages=history, max_tokens=2, stream=True, seed=7, temperature=0.3,  # type: ignore[arg-type]
                stream_options={"include_usage": True}) as response:
            chunks = sse_chunks(response.iter_lines())
        for chunk in chunks:
            openai_schema.validate("chat_chunk", chunk)
        assert [c["choices"][0]["delta"]["content"] for c in chunks[:-1]] == ["two", " words"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 2
        seen = stats(url)["requests"]
        assert seen[-1]["messages"] == history and seen[-1]["seed"] == 7 and seen[-1]["temperature"] == 0.3
        assert seen[-2]["messages"] == history and "stream" not in seen[-2]
    finally:
        proc.stop()


def test_completions(fast: str) -> None:
    """Text completions, whole and streamed, validate; without include_usage chunks carry no usage."""
    raw = client(fast).completions.with_raw_response.create(model=MODEL, prompt="abcd" * 5, max_tokens=2)
    body = json.loads(raw.text)
    openai_schema.validate("completion", body)
    assert body["choices"][0]["text"] == " tok0 tok1" and body["usage"]["prompt_tokens"] == 5
    with client(fast).completions.with_streaming_response.create(
            model=MODEL, prompt="abc", stream=True) as response:
        chunks = sse_chunks(response.iter_lines())
    for chunk in chunks:
        openai_schema.validate("completion_chunk", chunk)
        assert "usage" not in chunk
    assert len(chunks) == 16  # --max-tokens-default
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_errors_are_openai_shaped(fast: str) -> None:
    """No key is 401, a wrong model or path 404 and bad JSON 400, each a valid OpenAI error body."""
    chat = fast + "/v1/chat/completions"
    good = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode()
    cases = [
        (get_json(chat, key=None, body=good), 401),
        (get_json(chat, key="wrong", body=good), 401),
        (get_json(fast + "/v1/models", key=None), 401),
        (get_json(chat, body=json.dumps({"model": "other", "messages": []}).encode()), 404),
        (get_json(chat, body=b"{not json"), 400),
        (get_json(fast + "/v1/embeddings", body=b"{}"), 404),
        (get_json(chat, body=json.dumps({"model": MODEL, "messages": [], "max_tokens": 0}).encode()), 400),
    ]
    for (status, body), expected in cases:
        assert status == expected, body
        openai_schema.validate("error", body)
    with pytest.raises(openai.AuthenticationError):
        client(fast, key="wrong").models.list()
    with pytest.raises(openai.NotFoundError):
        client(fast).chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])


def test_metrics(fast: str) -> None:
    """/metrics is Prometheus text with the four sim series; a completion counts once, and none is left running."""
    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(fast + "/metrics", timeout=5) as r:
            text = r.read().decode()
        return {k: float(v) for k, v in (line.split(" ") for line in text.splitlines()
                                         if line and not line.startswith("#"))}

    before = scrape()
    assert set(before) == {"llmgw_sim_requests_running", "llmgw_sim_requests_waiting",
                           "llmgw_sim_requests_total", "llmgw_sim_requests_aborted_total"}
    client(fast).completions.create(model=MODEL, prompt="x", max_tokens=2)
    after = scrape()
    assert after["llmgw_sim_requests_total"] == before["llmgw_sim_requests_total"] + 1, (before, after)
    assert after["llmgw_sim_requests_running"] == after["llmgw_sim_requests_waiting"] == 0, after


def send_request(url: str, body: dict[str, Any]) -> socket.socket:
    """Send a completion request on a raw socket, so the test decides when the connection ends."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def test_disconnect_mid_stream_aborts(slow: str) -> None:
    """A client that goes away mid-stream frees its slot at once, counted as aborted."""
    before = stats(slow)["aborted"]
    sock = send_request(slow, {"model": MODEL, "prompt": "p", "stream": True})
    assert b"tok0" in sock.recv(65536) or b"tok0" in sock.recv(65536)
    closed = time.monotonic()
    sock.close()
    procs.wait_for(lambda: stats(slow)["aborted"] == before + 1 and stats(slow)["running"] == 0,
                   timeout=2.0, interval=0.01, what="mid-stream abort")
    print(f"mid-stream abort seen after {1000 * (time.monotonic() - closed):.0f} ms")


def test_disconnect_before_first_token_aborts(slow: str) -> None:
    """Requests that leave while waiting for the slot, or before a whole answer, are aborted too."""
    before = stats(slow)["aborted"]
    holder = send_request(slow, {"model": MODEL, "prompt": "p", "stream": True})
    try:
        procs.wait_for(lambda: stats(slow)["running"] == 1, timeout=2.0, what="slot taken")
        waiter = send_request(slow, {"model": MODEL, "prompt": "p", "stream": True})
        procs.wait_for(lambda: stats(slow)["waiting"] == 1, timeout=2.0, what="second request queued")
        waiter.close()
        procs.wait_for(lambda: stats(slow)["aborted"] == before + 1 and stats(slow)["waiting"] == 0,
                       timeout=2.0, interval=0.01, what="abort of the waiting request")
    finally:
        holder.close()
    procs.wait_for(lambda: stats(slow)["running"] == 0, timeout=2.0, what="slot freed")
    # A non-streaming request that leaves while generating (nothing written yet) frees the slot too.
    whole = send_request(slow, {"model": MODEL, "prompt": "p"})
    procs.wait_for(lambda: stats(slow)["running"] == 1, timeout=2.0, what="generation started")
    whole.close()
    procs.wait_for(lambda: stats(slow)["aborted"] == before + 3 and stats(slow)["running"] == 0,
                   timeout=2.0, interval=0.01, what="abort of the non-streaming request")


def test_startup_delay_and_sigterm(tmp_path: Path) -> None:
    """/health is 503 while 'loading', then 200; SIGTERM with a stream open exits 0 promptly."""
    proc, url = start_sim(tmp_path, "delayed", "--startup-delay", "1.0", "--decode-tps", "5")
    try:
        status, body = proc.wait_http(url + "/health", expect=lambda s, b: s in (200, 503), timeout=20)
        assert (status, json.loads(body)) == (503, {"status": "loading"})
        proc.wait_http(url + "/health", timeout=5)
        stream = send_request(url, {"model": MODEL, "prompt": "p", "stream": True})
        sent = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.popen.wait(timeout=5)
        elapsed = time.monotonic() - sent
        stream.close()
        assert code == 0, proc.log_tail()
        assert elapsed < 2.0, f"took {elapsed:.2f}s to exit"
    finally:
        proc.stop()
