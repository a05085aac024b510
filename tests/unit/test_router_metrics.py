"""The router's metrics and keep-alives, through ASGI calls to RouterApp with a fake upstream: no sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from llmgw.router import app as app_mod
from llmgw.router import errors, metrics
from llmgw.router.table import Endpoint, ModelRoute, RouteTable, TableHolder
from llmgw.testing import openai_schema

ENDPOINT = Endpoint(replica_id="r-1", url="http://engine.invalid")


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class FakeContent:
    """What relay reads of an aiohttp response body: readany() and iter_any()."""

    def __init__(self, chunks: list[bytes], *, first_delay: float = 0.0) -> None:
        self._chunks = list(chunks)
        self._first_delay = first_delay

    async def readany(self) -> bytes:
        if self._first_delay:
            await asyncio.sleep(self._first_delay)
            self._first_delay = 0.0
        return self._chunks.pop(0) if self._chunks else b""

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk


class FakeResponse:
    def __init__(self, status: int, content_type: str, chunks: list[bytes], *, first_delay: float = 0.0) -> None:
        self.status = status
        self.headers = {"Content-Type": content_type}
        self.content = FakeContent(chunks, first_delay=first_delay)
        self.closed = False

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.content.iter_any()])

    def close(self) -> None:
        self.closed = True

    def body_started(self) -> None: ...


class FakeForwarder:
    """Answers open() after ``delay`` with ``response``, or raises ``error``."""

    def __init__(self, response: FakeResponse | None = None, *, delay: float = 0.0,
                 error: errors.ApiError | None = None) -> None:
        self.response, self.delay, self.error = response, delay, error

    cancelled = False

    async def open(self, route: ModelRoute, path: str, body: bytes, *, key: object = None, stream: bool = False,
                   progress: bool = False,
                   ) -> tuple[Endpoint, FakeResponse]:
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return ENDPOINT, self.response

    async def start(self) -> None: ...
    async def close(self) -> None: ...


def router(model: str, forwarder: FakeForwarder | None = None, *, endpoints: tuple[Endpoint, ...] = (ENDPOINT,),
           **options: Any) -> app_mod.RouterApp:
    table = RouteTable(version=1, models=(ModelRoute(name=model, served_name=model, endpoints=endpoints),))
    app = app_mod.RouterApp(TableHolder(table), **options)
    if forwarder is not None:
        app._proxy.forwarder = forwarder  # type: ignore[assignment]
    return app


async def call(app: app_mod.RouterApp, path: str, body: bytes, *, method: str = "POST",
               leave_after: float | None = None) -> list[dict[str, Any]]:
    """Run one request through the app (the client leaving after ``leave_after`` s); the messages it sent."""
    sent: list[dict[str, Any]] = []
    delivered = False
    gone = asyncio.Event()
    if leave_after is not None:
        asyncio.get_running_loop().call_later(leave_after, gone.set)

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": method}, receive, send)
    return sent


def headers(sent: list[dict[str, Any]]) -> dict[bytes, bytes]:
    return dict(sent[0]["headers"])


def body_of(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent[1:])


def chat(model: str, *, stream: bool = False) -> bytes:
    return json.dumps({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_streamed_request_moves_ttft_itl_duration_and_counts() -> None:
    """A stream of three chunks: one TTFT, two gaps, one duration, a 200 counted on its replica, in-flight 0."""
    response = FakeResponse(200, "text/event-stream", [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"])
    app = router("m-stream", FakeForwarder(response))
    sent = asyncio.run(call(app, "/v1/chat/completions", chat("m-stream", stream=True)))
    assert body_of(sent) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert float(headers(sent)[b"x-llmgw-overhead-ms"]) >= 0 and response.closed
    assert sample("llmgw_router_time_to_first_token_seconds_count", model="m-stream") == 1
    assert sample("llmgw_router_inter_token_latency_seconds_count", model="m-stream") == 2
    assert sample("llmgw_router_request_duration_seconds_count", model="m-stream") == 1
    assert sample("llmgw_router_requests_total", model="m-stream", replica="r-1", code="200") == 1
    assert sample("llmgw_router_requests_in_flight", model="m-stream") == 0


def test_whole_request_has_overhead_header_and_no_ttft() -> None:
    """A whole answer carries x-llmgw-overhead-ms and the engine's status; TTFT is for streams only."""
    before = sample("llmgw_router_overhead_seconds_count")
    response = FakeResponse(400, "application/json", [b'{"error": {"message": "no"}}'])
    sent = asyncio.run(call(router("m-whole", FakeForwarder(response)), "/v1/embeddings",
                            b'{"model": "m-whole", "input": "x"}'))
    # The engine's error in OpenAI's shape (openai_shape): its message and status kept.
    assert sent[0]["status"] == 400 and json.loads(body_of(sent)) == {"error": {
        "message": "no", "type": "invalid_request_error", "param": None, "code": None}}
    assert 0 <= float(headers(sent)[b"x-llmgw-overhead-ms"]) < 1000
    assert sample("llmgw_router_requests_total", model="m-whole", replica="r-1", code="400") == 1
    assert sample("llmgw_router_time_to_first_token_seconds_count", model="m-whole") == 0
    assert sample("llmgw_router_overhead_seconds_count") == before + 1


def test_refusals_are_counted_without_the_clients_model_name() -> None:
    """An unknown model is counted under model="" (no client string as a label); no endpoint under its model."""
    before = sample("llmgw_router_requests_total", model="", replica="", code="404")
    sent = asyncio.run(call(router("m-known", FakeForwarder()), "/v1/completions", b'{"model": "made-up-name"}'))
    assert sent[0]["status"] == 404
    assert sample("llmgw_router_requests_total", model="", replica="", code="404") == before + 1
    assert sample("llmgw_router_requests_total", model="made-up-name", replica="", code="404") == 0
    before = sample("llmgw_router_requests_total", model="", replica="", code="503")
    sent = asyncio.run(call(router("m-idle", endpoints=()), "/v1/completions", b'{"model": "m-idle"}'))
    assert sent[0]["status"] == 503
    assert sample("llmgw_router_requests_total", model="", replica="", code="503") == before
    assert sample("llmgw_router_requests_total", model="m-idle", replica="", code="503") == 1


def test_body_over_the_limit_is_413_naming_it() -> None:
    """A body past max_body_bytes is a 413 OpenAI error naming the limit and the flag that raises it."""
    sent = asyncio.run(call(router("m", FakeForwarder(), max_body_bytes=10), "/v1/completions", b"x" * 11))
    assert sent[0]["status"] == 413
    error = json.loads(body_of(sent))
    openai_schema.validate("error", error)
    assert "10 bytes" in error["error"]["message"] and "--max-body-bytes" in error["error"]["message"]


def test_keepalive_while_the_first_chunk_is_slow() -> None:
    """Headers came at once but the first chunk takes 0.35 s: comments every 0.1 s, then the data."""
    response = FakeResponse(200, "text/event-stream", [b"data: 1\n\n"], first_delay=0.35)
    sent = asyncio.run(call(router("m-ka", FakeForwarder(response), keepalive_s=0.1), "/v1/completions",
                            chat("m-ka", stream=True)))
    bodies = [m["body"] for m in sent[1:] if m["body"]]
    assert bodies[-1] == b"data: 1\n\n" and set(bodies[:-1]) == {b": keep-alive\n\n"} and len(bodies) >= 3


def test_slow_headers_start_the_stream_late_and_a_failure_becomes_its_last_event() -> None:
    """No keep-alive before keepalive_s (a quick 502 stays a 502); after it, the 200 goes out with comments,
    and a failure then arrives as an error event an OpenAI client raises."""
    quick = asyncio.run(call(router("m-q", FakeForwarder(error=errors.upstream_failed("m-q", ["r-1: refused"])),
                                    keepalive_s=0.2), "/v1/completions", chat("m-q", stream=True)))
    assert quick[0]["status"] == 502
    slow = FakeForwarder(delay=0.35, error=errors.upstream_failed("m-s", ["r-1: reset"]))
    sent = asyncio.run(call(router("m-s", slow, keepalive_s=0.1), "/v1/completions", chat("m-s", stream=True)))
    assert sent[0]["status"] == 200 and b": keep-alive\n\n" in body_of(sent)
    last = body_of(sent).split(b"\n\n")[-2]
    assert last.startswith(b"data: ")
    openai_schema.validate("error", json.loads(last[len(b"data: "):]))


def test_client_leaving_during_keepalives_cancels_the_upstream_attempt() -> None:
    """A client gone while the stream is kept alive before the engine answered cancels the attempt; the
    request is counted with the 200 that went out, and nothing stays in flight."""
    slow = FakeForwarder(FakeResponse(200, "text/event-stream", [b"data: 1\n\n"]), delay=30)
    sent = asyncio.run(call(router("m-gone", slow, keepalive_s=0.05), "/v1/completions",
                            chat("m-gone", stream=True), leave_after=0.2))
    assert slow.cancelled and sent[0]["status"] == 200
    assert sample("llmgw_router_requests_total", model="m-gone", replica="", code="200") == 1
    assert sample("llmgw_router_requests_in_flight", model="m-gone") == 0


def test_render_exposes_queue_gauges_at_zero() -> None:
    """render() is Prometheus text with the queue gauges present (at 0 until admission exists)."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    assert b"llmgw_router_queued_requests 0.0" in body and b"llmgw_router_queue_oldest_seconds 0.0" in body


def test_metrics_path_only_when_asked() -> None:
    """/metrics is the router's own only with serve_metrics (in the server the control plane serves it)."""
    assert asyncio.run(call(router("m"), "/metrics", b"", method="GET"))[0]["status"] == 404
    sent = asyncio.run(call(router("m", serve_metrics=True), "/metrics", b"", method="GET"))
    assert sent[0]["status"] == 200 and b"llmgw_router_requests_total" in body_of(sent)
