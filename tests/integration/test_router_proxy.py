"""The router end to end: a router process in front of sim engine processes, driven by the openai client.

Every upstream is a real HTTP server on 127.0.0.1: sim engines as processes, and
two small servers written here for what no engine we have does on purpose: a
control plane's long poll, and an upstream that drops a kept-alive connection
the way xllamacpp's server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.router.table import TableHolder
from llmgw.router.watch import TableWatcher
from llmgw.testing import openai_schema
from llmgw.testing.fakecontrol import RouterControl
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.routed import Spawner

CLIENT_KEY = "client-key-the-engines-never-see"


class Cluster(Spawner):
    """Starts sim engines and routers for one test, and stops them all at its end."""

    def sim(self, model: str, *, api_key: str = "", decode_tps: float = 500.0) -> str:
        proc, url = self.spawn_sim(model, "--api-key", api_key, "--decode-tps", str(decode_tps))
        proc.wait_http(url + "/health", timeout=30)
        return url

    def router(self, *, doc: dict[str, Any] | None = None, control: str | None = None,
               wait: bool = True) -> str:
        # wait: until it serves its table; otherwise any answer (503 before a table arrives).
        return self.spawn_router(*(() if doc is not None else ("--control", str(control))), table=doc,
                                 expect=None if wait else (lambda status, _: True))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def model(name: str, *endpoints: tuple[str, str, str], served_name: str | None = None,
          aliases: tuple[str, ...] = (), state: str = "Ready", message: str = "") -> dict[str, Any]:
    return {"name": name, "served_name": served_name or name, "aliases": list(aliases), "state": state,
            "message": message or f"{len(endpoints)} of {len(endpoints)} replicas Ready",
            "endpoints": [{"replica_id": r, "url": u, "api_key": k} for r, u, k in endpoints]}


def client(router: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30)


def stats(sim: str) -> dict[str, int]:
    return httpx.get(sim + "/sim/stats", timeout=5).json()


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what still runs on a server thread's loop (held long polls, open connections), then end it."""
    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if thread.is_alive():
        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    loop.close()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


MESSAGES = [{"role": "user", "content": "hello"}]


# --- completions through the router ---------------------------------------------------------


def test_chat_and_completions_streaming_and_not(cluster: Cluster) -> None:
    """Chat and text completions, whole and streamed, arrive intact and valid per OpenAI's schemas."""
    sim = cluster.sim("smol", api_key="engine-secret")
    router = cluster.router(doc={"version": 1, "models": [model("smol", ("r-1", sim, "engine-secret"))]})
    c = client(router)

    chat = c.chat.completions.with_raw_response.create(model="smol", messages=MESSAGES, max_tokens=5)
    assert chat.headers["x-llmgw-upstream"] == "r-1"
    body = chat.parse()
    openai_schema.validate("chat", body.model_dump(exclude_unset=True))
    assert body.choices[0].message.content == " tok0 tok1 tok2 tok3 tok4"

    text = c.completions.create(model="smol", prompt="hi", max_tokens=3)
    openai_schema.validate("completion", text.model_dump(exclude_unset=True))
    assert text.choices[0].text == " tok0 tok1 tok2"

    chunks = list(c.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=4, stream=True))
    for chunk in chunks:
        openai_schema.validate("chat_chunk", chunk.model_dump(exclude_unset=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == " tok0 tok1 tok2 tok3"

    pieces = list(c.completions.create(model="smol", prompt="hi", max_tokens=2, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == " tok0 tok1"
    assert stats(sim)["completed"] == 4


def test_alias_is_rewritten_to_served_name(cluster: Cluster) -> None:
    """A request by alias or llmgw name reaches the engine under its served name (the sim 404s otherwise)."""
    sim = cluster.sim("qwen2.5-0.5b")
    router = cluster.router(doc={"version": 1, "models": [
        model("qwen", ("r-1", sim, ""), served_name="qwen2.5-0.5b", aliases=("small",))]})
    c = client(router)
    for name in ("small", "qwen", "qwen2.5-0.5b"):
        reply = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=1)
        assert reply.model == "qwen2.5-0.5b"


def test_engine_errors_are_relayed_but_a_refused_key_is_not(cluster: Cluster) -> None:
    """An engine's 400 reaches the client as it is; an engine refusing the router's key is the next
    endpoint's turn, and a 502 when none is left, never a 401 blaming the client's key."""
    sim = cluster.sim("m", api_key="right")
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-1", sim, "right")),
                                                          model("w", ("r-2", sim, "wrong"))]})
    bad = httpx.post(router + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    refused = httpx.post(router + "/v1/chat/completions", json={"model": "w", "messages": MESSAGES})
    assert refused.status_code == 502 and "HTTP 401" in refused.json()["error"]["message"]


def test_models_list(cluster: Cluster) -> None:
    """/v1/models lists every served name and alias in OpenAI's shape, ready or not."""
    router = cluster.router(doc={"version": 1, "models": [
        model("a", ("r-1", dead_url(), "")), model("b", served_name="b-served", aliases=("bee",),
                                                  state="Pending")]})
    body = httpx.get(router + "/v1/models").json()
    openai_schema.validate("models", body)
    assert [m["id"] for m in body["data"]] == ["a", "b-served", "bee"]
    assert [m.id for m in client(router).models.list()] == ["a", "b-served", "bee"]


def test_round_robin_across_two_engines(cluster: Cluster) -> None:
    """Requests alternate between a model's two endpoints."""
    a, b = cluster.sim("m"), cluster.sim("m")
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-a", a, ""), ("r-b", b, ""))]})
    c = client(router)
    served = [c.completions.with_raw_response.create(model="m", prompt="x", max_tokens=1).headers[
        "x-llmgw-upstream"] for _ in range(6)]
    assert served == ["r-a", "r-b"] * 3
    assert stats(a)["completed"] == 3 and stats(b)["completed"] == 3


# --- refusals ----------------------------------------------------------------------------------


def test_unknown_model_404_lists_models(cluster: Cluster) -> None:
    """An unknown model is a 404 model_not_found naming the models that exist."""
    router = cluster.router(doc={"version": 1, "models": [model("smol", ("r-1", dead_url(), ""))]})
    with pytest.raises(openai.NotFoundError) as info:
        client(router).chat.completions.create(model="gpt-9", messages=MESSAGES)
    openai_schema.validate("error", info.value.response.json())
    assert info.value.code == "model_not_found" and "smol" in info.value.message


def test_model_without_ready_endpoint_503_says_why(cluster: Cluster) -> None:
    """A known model with no ready endpoint is a 503 carrying the table's state and message."""
    why = "0 of 1 replicas Ready: replica r-1a2b Starting on node n1 for 12s"
    router = cluster.router(doc={"version": 1, "models": [model("smol", state="Starting", message=why)]})
    response = httpx.post(router + "/v1/chat/completions", json={"model": "smol", "messages": MESSAGES})
    assert response.status_code == 503
    openai_schema.validate("error", response.json())
    message = response.json()["error"]["message"]
    assert "Starting" in message and why in message and "llmgw get replicas" in message


@pytest.mark.parametrize(("body", "status"), [(b"{not json", 400), (b'{"messages": []}', 400),
                                              (b"[]", 400)])
def test_malformed_bodies_400(cluster: Cluster, body: bytes, status: int) -> None:
    """Malformed JSON or a body without model is a 400 invalid_request_error."""
    router = cluster.router(doc={"version": 1, "models": []})
    response = httpx.post(router + "/v1/chat/completions", content=body,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == status
    openai_schema.validate("error", response.json())
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_path_and_wrong_method(cluster: Cluster) -> None:
    """Unknown paths under /v1 are 404 and a GET on a POST endpoint 405, both OpenAI-shaped."""
    router = cluster.router(doc={"version": 1, "models": []})
    missing = httpx.post(router + "/v1/embeddingz", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    wrong = httpx.get(router + "/v1/chat/completions")
    assert wrong.status_code == 405
    openai_schema.validate("error", wrong.json())


# --- failures upstream ---------------------------------------------------------------------


def test_dead_endpoint_is_skipped(cluster: Cluster) -> None:
    """With one endpoint refusing connections, every request still succeeds on the other."""
    sim = cluster.sim("m")
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-dead", dead_url(), ""),
                                                                ("r-live", sim, ""))]})
    c = client(router)
    for stream in (False, True, False, True):
        if stream:
            assert list(c.completions.create(model="m", prompt="x", max_tokens=1, stream=True))
        else:
            reply = c.completions.with_raw_response.create(model="m", prompt="x", max_tokens=1)
            assert reply.headers["x-llmgw-upstream"] == "r-live"
    assert stats(sim)["completed"] == 4


def test_all_endpoints_dead_is_502(cluster: Cluster) -> None:
    """When every attempt fails the client gets a 502 naming each attempt."""
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-1", dead_url(), ""),
                                                                ("r-2", dead_url(), ""))]})
    response = httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "x"})
    assert response.status_code == 502
    openai_schema.validate("error", response.json())
    assert "r-1" in response.json()["error"]["message"] and "r-2" in response.json()["error"]["message"]


class StaleKeepAliveUpstream:
    """Answers one request per connection with keep-alive promised, then drops the connection
    when the next request arrives on it: xllamacpp's behaviour after a streamed response."""

    def __init__(self) -> None:
        self.port = free_port()
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = False
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if answered:
                    break  # the stale connection: close without a word
                body = json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "m",
                                   "choices": [{"index": 0, "text": "ok", "logprobs": None,
                                                "finish_reason": "stop"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                answered = True
        writer.close()

    def __enter__(self) -> StaleKeepAliveUpstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        stop_loop(self._loop, self._thread)


def test_engine_still_loading_is_skipped(cluster: Cluster) -> None:
    """An engine answering 503 while it loads is passed over for one that is ready."""
    loading_port = free_port()
    cluster.procs.append(Proc.start(
        [sys.executable, "-m", "llmgw.sim.engine", "--port", str(loading_port), "--model", "m",
         "--startup-delay", "120"], log_path=cluster.tmp_path / "sim-loading.log"))
    loading = f"http://127.0.0.1:{loading_port}"
    cluster.procs[-1].wait_http(loading + "/health", expect=lambda status, _: status == 503)
    ready = cluster.sim("m")
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-loading", loading, ""),
                                                                ("r-ready", ready, ""))]})
    for _ in range(4):
        assert _served_by(router, "r-ready")


def test_stale_pooled_connection_is_retried_fresh(cluster: Cluster) -> None:
    """A kept-alive connection the engine dropped is retried once on a fresh one, same engine."""
    with StaleKeepAliveUpstream() as upstream:
        router = cluster.router(doc={"version": 1, "models": [
            model("m", ("r-1", f"http://127.0.0.1:{upstream.port}", ""))]})
        c = client(router)
        for _ in range(3):  # the only endpoint: without the fresh retry the second request is a 502
            assert c.completions.create(model="m", prompt="x").choices[0].text == "ok"
        assert upstream.connections >= 3


def test_engine_dying_mid_stream_ends_with_an_error_event(cluster: Cluster) -> None:
    """An engine that dies after the first chunk ends the stream with an error the client raises."""
    sim = cluster.sim("m", decode_tps=20)
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-1", sim, ""))]})
    stream = client(router).completions.create(model="m", prompt="x", max_tokens=200, stream=True)
    with pytest.raises(openai.APIError, match="mid-stream"):
        for i, _ in enumerate(stream):
            if i == 0:
                cluster.procs[0].signal(9)  # the sim engine, started first


# --- client disconnects ---------------------------------------------------------------------


def _wait_aborted(sim: str) -> dict[str, int]:
    found = wait_for(lambda: (s := stats(sim))["aborted"] == 1 and s, timeout=10, what="sim aborted the request")
    assert isinstance(found, dict)
    return found


def test_client_disconnect_mid_stream_cancels_upstream(cluster: Cluster) -> None:
    """A streaming client that goes away makes the engine abort its request, not finish it."""
    sim = cluster.sim("m", decode_tps=20)  # 400 tokens: 20 s if nobody stops it
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-1", sim, ""))]})
    stream = client(router).chat.completions.create(model="m", messages=MESSAGES, max_tokens=400, stream=True)
    next(iter(stream))
    started = time.monotonic()
    stream.close()
    found = _wait_aborted(sim)
    assert found["running"] == 0 and found["completed"] == 0
    assert time.monotonic() - started < 10


def test_client_disconnect_while_waiting_for_whole_reply_cancels_upstream(cluster: Cluster) -> None:
    """A non-streaming client that times out makes the engine abort too."""
    sim = cluster.sim("m", decode_tps=20)
    router = cluster.router(doc={"version": 1, "models": [model("m", ("r-1", sim, ""))]})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 400},
                   timeout=httpx.Timeout(5, read=0.5))
    assert _wait_aborted(sim)["completed"] == 0


# --- following the control plane -----------------------------------------------------------


def _served_by(router: str, replica: str) -> bool:
    response = httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
    return response.status_code == 200 and response.headers["x-llmgw-upstream"] == replica


def test_router_follows_the_control_plane_and_outlives_it(cluster: Cluster) -> None:
    """No table yet: 503. Then each new doc is followed; with the control plane down the last table
    keeps serving; when it is back the router follows it again."""
    a, b = cluster.sim("m"), cluster.sim("m")
    control = RouterControl({"version": 1, "models": [model("m", ("r-a", a, ""))]})
    try:
        router = cluster.router(control=control.url, wait=False)
        not_loaded = httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert not_loaded.status_code == 503 and not_loaded.json()["error"]["code"] == "routes_not_loaded"

        control.start()
        wait_for(lambda: _served_by(router, "r-a"), timeout=15, what="router serving from v1")
        control.set_doc({"version": 2, "models": [model("m", ("r-b", b, ""))]})
        wait_for(lambda: _served_by(router, "r-b"), timeout=5, what="router serving from v2")

        control.stop()
        # The watcher has found it down (a stalled one never would) and keeps the table it had.
        router_log = cluster.tmp_path / f"router-{router.rsplit(':', 1)[1]}.log"
        wait_for(lambda: "serving the last table (v2), retrying" in router_log.read_text(), timeout=10,
                 what="the router noticing the control plane is down")
        for _ in range(3):
            assert _served_by(router, "r-b")

        control.doc = {"version": 3, "models": [model("m", ("r-a", a, ""))]}
        control.start()
        wait_for(lambda: _served_by(router, "r-a"), timeout=15, what="router serving from v3")
    finally:
        control.close()


def test_long_poll_is_used_not_a_busy_loop(cluster: Cluster) -> None:
    """With nothing changing, the watcher holds one long poll open (not asking again and again, not idle),
    and a change reaches the router through that poll at once."""
    control = RouterControl({"version": 5, "models": []}).start()
    try:
        router = cluster.router(control=control.url)
        # Polling, and on the long poll: a request naming the version it has is held open by the control plane.
        # A watcher that stopped after its first table never gets here.
        wait_for(lambda: control.held == 1, timeout=10, what="a long poll held open by the control plane")
        after, timeout = control.queries[-1]
        assert after == 5 and timeout >= 10, control.queries
        # Not a busy loop: over a second with nothing changing, the same poll is still the one held.
        held_at = control.polls
        time.sleep(1.0)
        assert control.polls == held_at and control.held == 1, control.queries
        assert control.polls <= 3, control.queries
        # The held poll is what brings a change: far sooner than its timeout.
        t0 = time.monotonic()
        control.set_doc({"version": 6, "models": [model("fresh", ("r-1", dead_url(), ""))]})
        wait_for(lambda: "fresh" in httpx.get(router + "/v1/models", timeout=5).text, timeout=5,
                 what="the change served by the router")
        assert time.monotonic() - t0 < timeout / 2
        assert control.queries[held_at - 1][0] == 5 and all(a == 6 for a, _ in control.queries[held_at:])
    finally:
        control.close()


async def _until(predicate: Callable[[], bool], *, timeout: float = 5.0) -> None:
    """Polls ``predicate`` on the running loop; TimeoutError when it stays false, so a stall fails the test."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


def test_watcher_in_process_keeps_last_table_on_bad_doc_and_stops_promptly() -> None:
    """A document the router cannot read leaves the last table in place until a good one comes;
    stop() returns at once even while a long poll is held."""
    control = RouterControl({"version": 1, "models": [model("m", ("r-1", dead_url(), ""))]}).start()
    try:
        async def run() -> tuple[list[int], float]:
            holder = TableHolder()
            watcher = TableWatcher(control.url, holder, poll_timeout_s=30, backoff_min_s=0.05)
            await watcher.start()
            seen = []
            try:
                assert await watcher.wait_loaded(5)
                seen.append(holder.current.version)
                asked = len(control.queries)
                control.set_doc({"version": 2, "models": "not a list"})
                # Several refused answers: the bad document was served, and asked for again, at least twice.
                await _until(lambda: len(control.queries) >= asked + 3)
                seen.append(holder.current.version)
                control.set_doc({"version": 3, "models": []})
                await _until(lambda: holder.current.version == 3)
                seen.append(holder.current.version)
                await _until(lambda: control.held == 1)  # a poll with after=3 is now held by the control plane
                assert control.queries[-1][0] == 3, control.queries
            finally:
                started = time.monotonic()
                await watcher.stop()
            return seen, time.monotonic() - started
        seen, took = asyncio.run(run())
        assert seen == [1, 1, 3]
        assert took < 0.5
    finally:
        control.close()
