"""Scale to zero at the router: a request for a model with no replica is held, reported at once, and answered.

A standalone router process follows a stand-in control plane (``fakecontrol.RouterControl``, serving
the endpoints document's long poll and recording the router's load reports at
``POST /api/v1/router/signals``); the engine is a sim engine process, started only
once the router holds requests for it, as a replica starting from zero would be.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import prometheus_client.parser
import pytest

from llmgw.testing.fakecontrol import RouterControl
from llmgw.testing.procs import wait_for
from llmgw.testing.routed import Spawner

COLD_MESSAGE = "no replica: scaled to zero after 300s idle; the next request starts one (cold start, up to 60s)"
MESSAGES = [{"role": "user", "content": "hello"}]


def cold_model(*, timeout_s: float = 60.0, endpoints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"name": "m", "served_name": "m", "state": "Ready" if endpoints else "Cold",
            "message": "1 of 1 replicas Ready" if endpoints else COLD_MESSAGE, "endpoints": endpoints or [],
            "autoscale": {"min_replicas": 0, "max_replicas": 2, "cold_start_timeout_s": timeout_s}}


def held(control: RouterControl) -> int:
    """The most requests for m any load report said were held."""
    return max((m["held"] for r in list(control.reports) for m in r["models"] if m["model"] == "m"), default=0)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.stop_all()


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        yield executor


def control_plane(doc: dict[str, Any]) -> Iterator[RouterControl]:
    control = RouterControl(doc)
    try:
        control.start()
        yield control
    finally:
        control.close()


@pytest.fixture
def cold_control() -> Iterator[RouterControl]:
    yield from control_plane({"version": 1, "models": [cold_model()]})


@pytest.fixture
def short_control() -> Iterator[RouterControl]:
    yield from control_plane({"version": 1, "models": [cold_model(timeout_s=1.0)]})


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition, None when it is not there."""
    for family in prometheus_client.parser.text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None


def raw_stream(router: str) -> tuple[int, list[bytes]]:
    """A streamed chat request read as the bytes' events: keep-alive comments included, which SDKs drop."""
    with httpx.stream("POST", router + "/v1/chat/completions", timeout=60,
                      json={"model": "m", "messages": MESSAGES, "max_tokens": 3, "stream": True}) as resp:
        events = [e for e in resp.read().split(b"\n\n") if e]
    return resp.status_code, events


def test_a_request_at_zero_is_held_reported_at_once_and_answered(procs: Spawner, cold_control: RouterControl,
                                                                 pool: concurrent.futures.ThreadPoolExecutor) -> None:
    """Whole and streamed requests to a model at zero wait with keep-alives, the router reports the wake
    at once (its interval is an hour), and once a replica is in the table every one is answered."""
    router = procs.spawn_router("--control", cold_control.url, "--keepalive", "0.2", "--signals-interval", "3600")
    listed = httpx.get(router + "/v1/models").json()["data"]
    assert listed == [{"id": "m", "object": "model", "created": 0, "owned_by": "llmgw", "llmgw": {"state": "cold"}}]

    client = openai.OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=60)
    whole = pool.submit(client.chat.completions.create, model="m", messages=MESSAGES, max_tokens=4)
    streamed = pool.submit(lambda: list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4,
                                                                       stream=True)))
    raw = pool.submit(raw_stream, router)
    # Only a wake can have sent this report: the periodic one is an hour away.
    wait_for(lambda: held(cold_control) == 3, timeout=20, what="a report holding the 3 requests")
    assert not (whole.done() or streamed.done() or raw.done())

    proc, sim = procs.spawn_sim("m")
    proc.wait_http(sim + "/health", timeout=30)
    cold_control.set_doc({"version": 2, "models": [cold_model(endpoints=[{"replica_id": "m-1", "url": sim}])]})

    assert whole.result(30).choices[0].message.content == " tok0 tok1 tok2 tok3"
    chunks = streamed.result(30)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " tok0 tok1 tok2 tok3"
    status, events = raw.result(30)
    assert status == 200
    assert events[0] == b": keep-alive" and events[-1] == b"data: [DONE]"
    assert sum(e.startswith(b"data: {") for e in events) == 3
    metrics = httpx.get(router + "/metrics").text
    assert sample(metrics, "llmgw_router_cold_start_seconds_count", model="m") == 3
    assert sample(metrics, "llmgw_router_requests_total", model="m", replica="m-1", code="200") == 3
    assert sample(metrics, "llmgw_router_requests_total", model="m", replica="", code="503") is None


def test_past_the_cold_start_timeout_a_503_says_when_to_retry_and_why(procs: Spawner,
                                                                     short_control: RouterControl) -> None:
    """With no replica ever, a request is held for the model's cold-start timeout, then refused with
    503, Retry-After and the model's state and message; a stream held past its keep-alive ends in that error."""
    router = procs.spawn_router("--control", short_control.url, "--keepalive", "0.2")
    refused = httpx.post(router + "/v1/chat/completions", timeout=30,
                         json={"model": "m", "messages": MESSAGES, "max_tokens": 3})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    error = refused.json()["error"]
    assert error["code"] == "model_cold" and f"Cold: {COLD_MESSAGE}" in error["message"]
    assert "cold-start timeout of 1s" in error["message"]

    status, events = raw_stream(router)
    assert status == 200 and events[0] == b": keep-alive"
    assert events[-1].startswith(b"data: {\"error\"") and b"model_cold" in events[-1]
    assert held(short_control) >= 1


def test_a_control_plane_refusing_reports_delays_no_request(procs: Spawner, cold_control: RouterControl,
                                                             tmp_path: Path) -> None:
    """Reports answered with 500 again and again: requests are still held and answered, and the router
    logs the failure once, not once per report."""
    cold_control.refuse_signals = True
    router = procs.spawn_router("--control", cold_control.url, "--signals-interval", "0.1")
    client = openai.OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=60)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        whole = pool.submit(client.chat.completions.create, model="m", messages=MESSAGES, max_tokens=2)
        wait_for(lambda: cold_control.refused >= 5, timeout=20, what="five refused reports")
        proc, sim = procs.spawn_sim("m")
        proc.wait_http(sim + "/health", timeout=30)
        cold_control.set_doc({"version": 2, "models": [cold_model(endpoints=[{"replica_id": "m-1", "url": sim}])]})
        assert whole.result(30).choices[0].message.content == " tok0 tok1"
    logs = "".join(p.read_text() for p in tmp_path.glob("router-*.log"))
    assert logs.count("cannot report load signals") == 1 and "HTTP 500" in logs


def test_a_request_for_an_adapter_of_a_base_at_zero_wakes_the_base(procs: Spawner) -> None:
    """An adapter's replicas are its base's: a request held for the adapter is reported as the base's (the
    autoscaler scales models, not adapters), so the base wakes; reported as the adapter's, it never would."""
    base = {**cold_model(timeout_s=3.0), "adapters": ["sql"]}
    control = RouterControl({"version": 1, "models": [base]})
    try:
        control.start()
        router = procs.spawn_router("--control", control.url, "--signals-interval", "3600")
        with concurrent.futures.ThreadPoolExecutor(1) as one:
            asked = one.submit(httpx.post, router + "/v1/chat/completions", timeout=30,
                               json={"model": "sql", "messages": MESSAGES, "max_tokens": 3})
            wait_for(lambda: held(control) == 1, timeout=20, what="a report holding the adapter's request for m")
            assert all(m["model"] != "sql" for r in list(control.reports) for m in r["models"])
            assert asked.result(30).status_code == 503  # no replica ever came: the cold-start timeout's answer
    finally:
        control.close()
