"""A model at zero in the router: read from the table, listed as cold, its requests held and answered in process.

The app is called as an ASGI app with plain message dicts: no socket, no engine
(the case with an engine, end to end, is tests/integration/test_router_cold.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from llmgw.router import app as app_mod
from llmgw.router import signals
from llmgw.router.table import RouteAutoscale, RouteTable, TableHolder

COLD = "no replica: scaled to zero after 300s idle; the next request starts one (cold start, up to 60s)"


def cold(*, timeout_s: float = 60.0, **extra: Any) -> dict[str, Any]:
    return {"name": "m", "state": "Cold", "message": COLD, "endpoints": [],
            "autoscale": {"min_replicas": 0, "max_replicas": 4, "cold_start_timeout_s": timeout_s}} | extra


def table(version: int, *models: dict[str, Any]) -> RouteTable:
    return RouteTable.from_doc({"version": version, "models": list(models)})


class Call:
    """One request to the app: the messages it sent back, as they came."""

    def __init__(self, app: app_mod.RouterApp, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        raw = json.dumps(body).encode() if body is not None else b""
        scope = {"type": "http", "method": method, "path": path, "headers": []}
        messages = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # the client never leaves
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            self.sent.append(dict(message))

        self.task = asyncio.ensure_future(app(scope, receive, send))

    async def done(self) -> None:
        await asyncio.wait_for(self.task, 30)  # a bound against a hang, not a timing

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent[1:] if m.get("body")]

    def json(self) -> Any:
        return json.loads(b"".join(self.bodies))


async def until(check: Callable[[], object]) -> None:
    """Let the app's task run until ``check()`` holds (bounded: a broken app fails, never hangs)."""
    for _ in range(100_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def chat(*, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def test_autoscale_is_read_from_the_document_and_may_be_absent_or_malformed(caplog: pytest.LogCaptureFixture) -> None:
    """The bounds and timeout are read; no entry means not autoscaled; a malformed one is warned about, not fatal."""
    with caplog.at_level(logging.WARNING):
        t = table(1, cold(timeout_s=5), {"name": "plain"}, {"name": "bad", "autoscale": [1]},
                  {"name": "odd", "autoscale": {"min_replicas": -1, "max_replicas": 2, "cold_start_timeout_s": "x"}})
    m, plain, bad, odd = t.models
    assert m.autoscale == RouteAutoscale(min_replicas=0, max_replicas=4, cold_start_timeout_s=5.0) and m.cold
    assert plain.autoscale is None and not plain.cold
    assert bad.autoscale is None
    assert odd.autoscale == RouteAutoscale(min_replicas=0, max_replicas=2, cold_start_timeout_s=60.0)
    assert len([r for r in caplog.records if "autoscale" in r.getMessage()]) == 3


def test_a_cold_model_is_listed_with_its_vendor_field() -> None:
    """/v1/models keeps a model at zero, marked cold; a model with a replica carries no such field."""
    ready = {"name": "r", "endpoints": [{"replica_id": "r-1", "url": "http://127.0.0.1:9"}],
             "autoscale": {"min_replicas": 0, "max_replicas": 1}}

    async def run() -> Any:
        call = Call(app_mod.RouterApp(TableHolder(table(1, cold(), ready))), "GET", "/v1/models")
        await call.done()
        return call.json()["data"]

    listed = {m["id"]: m for m in asyncio.run(run())}
    assert listed["m"]["llmgw"] == {"state": "cold"} and "llmgw" not in listed["r"]


def test_a_held_request_past_its_timeout_gets_a_503_with_retry_after_and_the_state() -> None:
    """Held (and counted as held) for the model's cold-start timeout, then 503, Retry-After, the state and message."""
    reporter = signals.Reporter("r1")
    seen_held: list[int] = []

    async def run() -> Call:
        app = app_mod.RouterApp(TableHolder(table(1, cold(timeout_s=0.2))), signals=reporter)
        call = Call(app, "POST", "/v1/chat/completions", chat())
        await until(lambda: "m" in reporter.counts and reporter.counts["m"].held)
        seen_held.append([e for e in reporter.report().to_doc()["models"] if e["model"] == "m"][0]["held"])
        await call.done()
        return call

    call = asyncio.run(run())
    assert seen_held == [1] and reporter.counts["m"].held == 0
    assert call.status == 503 and call.headers[b"retry-after"] == b"5"
    error = call.json()["error"]
    assert error["code"] == "model_cold" and f"(Cold: {COLD})" in error["message"]
    assert "Retry in 5s" in error["message"]


def test_a_held_stream_gets_keep_alives_then_the_timeout_as_its_last_event() -> None:
    """A stream held past keepalive_s has its 200 and comments; past the timeout the error is its last event."""
    async def run() -> Call:
        app = app_mod.RouterApp(TableHolder(table(1, cold(timeout_s=0.3))), keepalive_s=0.05)
        call = Call(app, "POST", "/v1/chat/completions", chat(stream=True))
        await call.done()
        return call

    call = asyncio.run(run())
    assert call.status == 200 and call.headers[b"content-type"] == b"text/event-stream"
    assert call.bodies[0] == b": keep-alive\n\n" and len(call.bodies) >= 3
    last = call.bodies[-1]
    assert last.startswith(b"data: ") and json.loads(last[6:])["error"]["code"] == "model_cold"
    assert call.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


@pytest.mark.parametrize(("new_models", "status", "code"), [
    ([{"name": "m", "state": "Stopped", "message": "scaled to 0 by hand"}], 503, "model_not_ready"),
    ([{"name": "other"}], 404, "model_not_found"),
])
def test_a_new_table_that_ends_the_wait_answers_held_requests_at_once(new_models: list[dict[str, Any]], status: int,
                                                                     code: str) -> None:
    """A table that takes the model's autoscale away, or the model itself, answers what it held, not at the timeout."""
    async def run() -> Call:
        holder = TableHolder(table(1, cold(timeout_s=3600)))
        app = app_mod.RouterApp(holder)
        call = Call(app, "POST", "/v1/chat/completions", chat())
        await until(lambda: app._cold.waiters)
        holder.swap(table(2, *new_models))
        await call.done()
        return call

    call = asyncio.run(run())
    assert call.status == status and call.json()["error"]["code"] == code


def test_a_table_still_without_an_endpoint_keeps_the_request_held() -> None:
    """A new table in which the model is still at zero wakes the held request, which goes back to waiting."""
    async def run() -> tuple[bool, int]:
        holder = TableHolder(table(1, cold(timeout_s=3600)))
        app = app_mod.RouterApp(holder)
        call = Call(app, "POST", "/v1/chat/completions", chat())
        await until(lambda: app._cold.waiters)
        holder.swap(table(2, cold(timeout_s=3600), {"name": "other"}))
        await until(lambda: app._cold.waiters)
        still = not call.task.done()
        call.task.cancel()  # the client left
        await asyncio.gather(call.task, return_exceptions=True)
        return still, len(app._cold.waiters)

    assert asyncio.run(run()) == (True, 0)
