"""OpenTelemetry spans from a real router process, received by a real OTLP/HTTP endpoint.

``otlp.Collector`` is a small aiohttp server in a thread that decodes each POSTed
``ExportTraceServiceRequest`` (protobuf, as the OTLP/HTTP exporter sends it) and
keeps its spans. The router runs as a standalone process in front of a sim
engine, which lists the ``traceparent`` headers it received in ``/sim/stats``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing.otlp import Collector
from llmgw.testing.procs import Proc, free_port, wait_for

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as c:
        yield c


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


def _sim(tmp_path: Path, procs: list[Proc]) -> str:
    port = free_port()
    procs.append(Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--host", "127.0.0.1", "--port", str(port),
                             "--model", "m"], log_path=tmp_path / "sim.log"))
    url = f"http://127.0.0.1:{port}"
    procs[-1].wait_http(url + "/health", timeout=30)
    return url


def _router(tmp_path: Path, procs: list[Proc], sim: str, *extra: str) -> str:
    port = free_port()
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"version": 1, "models": [
        {"name": "m", "state": "Ready", "endpoints": [{"replica_id": "m-1", "url": sim}]}]}))
    procs.append(Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port",
                             str(port), "--table-file", str(table), *extra], log_path=tmp_path / "router.log"))
    url = f"http://127.0.0.1:{port}"
    procs[-1].wait_http(url + "/v1/models", timeout=30)
    return url


def test_spans_continue_the_clients_trace_and_reach_the_engine(tmp_path: Path, collector: Collector,
                                                                procs: list[Proc]) -> None:
    """One request: router, admission, schedule and upstream spans in the client's trace; the engine got traceparent."""
    sim = _sim(tmp_path, procs)
    router = _router(tmp_path, procs, sim, "--tracing-endpoint", collector.url)
    answer = httpx.post(router + "/v1/chat/completions", timeout=10,
                        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "max_tokens": 3})
    assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")

    wait_for(lambda: len(collector.spans) >= 4, timeout=20, what="four spans exported")
    by_name = {s.name: s for s in collector.spans}
    assert set(by_name) == {"router /v1/chat/completions", "admission", "schedule", "upstream"}
    assert collector.content_types == ["application/x-protobuf"] * len(collector.content_types)
    root = by_name["router /v1/chat/completions"]
    assert root.trace_id.hex() == CLIENT_TRACE and root.parent_span_id.hex() == CLIENT_SPAN
    for name in ("admission", "schedule", "upstream"):
        span = by_name[name]
        assert span.trace_id == root.trace_id and span.parent_span_id == root.span_id, name
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
        assert span.end_time_unix_nano <= root.end_time_unix_nano
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["llmgw.model"].string_value == "m"
    assert attributes["llmgw.replica"].string_value == "m-1"
    assert attributes["http.response.status_code"].int_value == 200
    upstream = by_name["upstream"]
    assert [e.name for e in upstream.events] == ["first byte to the client"]

    seen = httpx.get(sim + "/sim/stats", timeout=5).json()["traceparents"]
    assert seen == [f"00-{CLIENT_TRACE}-{upstream.span_id.hex()}-01"]


def test_no_tracing_endpoint_no_traceparent(tmp_path: Path, procs: list[Proc]) -> None:
    """Without --tracing-endpoint the engine sees no traceparent, and the client's is not passed on either."""
    sim = _sim(tmp_path, procs)
    router = _router(tmp_path, procs, sim)
    answer = httpx.post(router + "/v1/completions", timeout=10,
                        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                        json={"model": "m", "prompt": "hi", "max_tokens": 2})
    assert answer.status_code == 200
    assert httpx.get(sim + "/sim/stats", timeout=5).json()["traceparents"] == []
