"""The router's load reports for the autoscaler: what a report carries, when it goes, and that sending never blocks."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from llmgw.api.routing import LoadReport
from llmgw.core import autoscale
from llmgw.router import metrics, relay, signals
from llmgw.router.table import RouteTable, TableHolder

BUCKETS = len(autoscale.TTFT_BUCKETS_MS) + 1


def holder(*models: dict[str, Any]) -> TableHolder:
    return TableHolder(RouteTable.from_doc({"version": 1, "models": list(models)}))


def model(name: str, *replicas: str) -> dict[str, Any]:
    return {"name": name, "endpoints": [{"replica_id": r, "url": f"http://127.0.0.1:{9000 + i}"}
                                        for i, r in enumerate(replicas)]}


def reporter(h: TableHolder, *, in_flight: dict[str, int] | None = None, queued: dict[str, int] | None = None,
             **kw: Any) -> signals.Reporter:
    r = signals.Reporter("r1", clock=lambda: 1000.0, **kw)
    waiting = queued or {}
    r.attach(h, in_flight=in_flight if in_flight is not None else {}, queued=lambda m: waiting.get(m, 0))
    return r


def entry(report: LoadReport | dict[str, Any], name: str) -> dict[str, Any]:
    doc = report.to_doc() if isinstance(report, LoadReport) else report
    found = [m for m in doc["models"] if m["model"] == name]
    assert len(found) == 1, doc
    return found[0]


def test_report_carries_deltas_and_gauges_and_resets_the_deltas() -> None:
    """Arrivals, TTFT counts and tokens are deltas gone from the next report; waiting and in flight stay."""
    h = holder(model("m", "m-a", "m-b"))
    r = reporter(h, in_flight={"m-a": 2, "m-b": 3, "other-x": 7}, queued={"m": 3})
    now = time.perf_counter()
    for _ in range(12):
        counts = r.arrived("m", now)
    trace = metrics.Trace("m", now - 0.03)
    trace.signals = counts
    trace.first_chunk(now, now)  # 30 ms after arrival
    trace.tokens = 345
    trace.finish(now)

    doc = r.report().to_doc()
    assert doc["router"] == "r1" and doc["interval_s"] == 2.0 and doc["sent_at"] == 1000.0
    first = entry(doc, "m")
    expected_ttft = [0] * BUCKETS
    expected_ttft[1] = 1  # 25 < 30 <= 50
    assert first == {"model": "m", "arrived": 12, "waiting": 3, "in_flight": 5, "held": 0,
                     "ttft_counts": expected_ttft, "tokens_out": 345, "last_request_at": pytest.approx(1000.0, abs=1),
                     "errors": 0, "tokens_in": 0, "replicas": {"m-a": {"in_flight": 2}, "m-b": {"in_flight": 3}}}

    second = entry(r.report(), "m")
    assert second["arrived"] == 0 and second["ttft_counts"] == [0] * BUCKETS and second["tokens_out"] == 0
    assert second["waiting"] == 3 and second["in_flight"] == 5 and second["replicas"]["m-b"] == {"in_flight": 3}


def test_last_request_at_is_the_newest_arrival_in_wall_time() -> None:
    """The newest arrival (a perf_counter reading) is reported as unix time by the reporter's clock."""
    r = reporter(holder(model("m", "m-a")))
    r.arrived("m", time.perf_counter() - 30.0)
    r.arrived("m", time.perf_counter() - 10.0)
    assert entry(r.report(), "m")["last_request_at"] == pytest.approx(990.0, abs=1)


@pytest.mark.parametrize(("ms", "bucket"), [(0.0, 0), (25.0, 0), (25.5, 1), (500.0, 5), (60000.0, BUCKETS - 2),
                                            (90000.0, BUCKETS - 1)])
def test_first_tokens_land_in_the_shared_ttft_buckets(ms: float, bucket: int) -> None:
    """A TTFT on a bound counts in that bucket (le), past the last bound in +inf: what ttft_quantile reads."""
    counts = signals.ModelCounts()
    counts.first_token(ms / 1000.0)
    assert counts.ttft.index(1) == bucket and sum(counts.ttft) == 1


def test_quiet_models_are_left_out_and_gone_ones_still_reported() -> None:
    """A model with nothing new and no load is not listed; counts of a model the table dropped still are."""
    r = reporter(holder(model("quiet", "q-a"), model("busy", "b-a")), in_flight={"b-a": 1})
    r.arrived("gone", time.perf_counter())
    doc = r.report().to_doc()
    assert [m["model"] for m in doc["models"]] == ["busy", "gone"]
    assert entry(doc, "gone")["replicas"] == {} and entry(doc, "gone")["arrived"] == 1
    assert [m.model for m in r.report().models] == ["busy"]


def test_held_requests_count_as_waiting_and_held() -> None:
    """A request held at zero is in both gauges until released; admission's queue adds to waiting."""
    r = reporter(holder(model("m")), queued={"m": 2})
    counts = r.arrived("m", time.perf_counter())
    r.held(counts)
    r.held(counts)
    held = entry(r.report(), "m")
    assert (held["held"], held["waiting"], held["replicas"]) == (2, 4, {})
    r.released(counts)
    r.released(counts)
    assert (entry(r.report(), "m")["held"], entry(r.report(), "m")["waiting"]) == (0, 2)


def test_errors_and_tokens_in_are_deltas_for_the_charts() -> None:
    """A 5xx answer counts as an error, a 4xx not; prompt tokens (added where metered) go out and are reset."""
    r = reporter(holder(model("m", "m-a")))
    now = time.perf_counter()
    for status in (200, 502, 503, 429):
        counts = r.arrived("m", now)
        trace = metrics.Trace("m", now)
        trace.signals, trace.status = counts, status
        trace.finish(now)
    counts.tokens_in += 120
    first = entry(r.report(), "m")
    assert first["errors"] == 2 and first["tokens_in"] == 120
    assert LoadReport.from_doc(r.report().to_doc()).models == ()  # reset, and a quiet model is left out
    # An older router's report (no errors, no tokens_in) reads as 0 of each.
    old = LoadReport.from_doc({"router": "r0", "interval_s": 2.0, "models": [{"model": "m", "arrived": 1}]})
    assert old.models[0].errors == 0 and old.models[0].tokens_in == 0


def test_tokens_out_from_usage_else_from_events() -> None:
    """The relay's count: usage's completion_tokens when the bytes carry it, else one per SSE event but [DONE]."""
    whole = b'{"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 17, "total_tokens": 26}}'
    assert relay.completion_tokens(whole) == 17
    assert relay.completion_tokens(b'{"choices": []}') is None
    assert relay._stream_tokens(5, b"data: [DONE]\n\n") == 4
    assert relay._stream_tokens(6, b'data: {"usage": {"completion_tokens": 4}}\n\ndata: [DONE]\n\n') == 4


def test_a_held_request_is_reported_at_once() -> None:
    """With a long interval, holding a request sends a report now, and it says the model is wanted."""
    delivered: list[LoadReport] = []

    async def run() -> None:
        r = reporter(holder(model("m")), deliver=delivered.append, interval_s=3600)
        await r.start()
        try:
            await asyncio.sleep(0)  # the task reaches its first wait
            assert delivered == []
            r.held(r.arrived("m", time.perf_counter()))
            for _ in range(1000):
                if delivered:
                    break
                await asyncio.sleep(0.01)
        finally:
            await r.stop()

    asyncio.run(run())
    assert len(delivered) == 1 and entry(delivered[0], "m")["held"] == 1


def test_a_failing_control_plane_is_logged_once_and_never_blocks_counting(caplog: pytest.LogCaptureFixture) -> None:
    """A raising, then a hanging delivery: each send gives up (bounded), the hooks keep counting, one warning in all."""
    calls: list[str] = []

    def deliver(report: LoadReport) -> object:
        calls.append("x")
        if len(calls) <= 2:
            raise ConnectionError("control plane down")
        if len(calls) <= 4:
            return asyncio.get_running_loop().create_future()  # never resolved: a send that hangs
        return None

    async def run() -> list[bool]:
        r = reporter(holder(model("m")), deliver=deliver, timeout_s=0.05)
        results = []
        for _ in range(5):
            counts = r.arrived("m", time.perf_counter())
            r.held(counts)
            r.released(counts)
            results.append(await r.flush())
        return results

    with caplog.at_level(logging.INFO, logger="llmgw.router.signals"):
        assert asyncio.run(run()) == [False, False, False, False, True]
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "control plane down" in warnings[0].getMessage()
    assert any("again" in rec.getMessage() for rec in caplog.records if rec.levelno == logging.INFO)


def test_the_url_follows_the_control_plane_followed_now() -> None:
    """A callable control URL is read at each send, so reports follow the watcher's failover."""
    current = ["http://cp1:8080"]
    r = signals.Reporter("r1", control_url=lambda: current[0])
    assert r.url() == "http://cp1:8080/api/v1/router/signals"
    current[0] = "http://cp2:8080/"
    assert r.url() == "http://cp2:8080/api/v1/router/signals"
