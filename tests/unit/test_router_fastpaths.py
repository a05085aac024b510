"""The router's hot-path shortcuts give exactly what the slow paths they replace gave."""

from __future__ import annotations

import json

import prometheus_client as prom
import pytest

from llmgw.router import client, errors, metrics, request


@pytest.mark.parametrize("body", [
    b'{"model": "m", "stream": true}',
    '\ufeff{"model": "m"}'.encode(),  # a UTF-8 BOM: json.loads on bytes strips it
    '{"model": "m"}'.encode("utf-16"),  # json.loads on bytes reads UTF-16 too
    b'{"model": "\xed\xa0\x80"}',  # an encoded lone surrogate: json.loads lets it pass
])
def test_body_parse_accepts_what_json_loads_accepts(body: bytes) -> None:
    """The UTF-8 fast path falls back to json.loads for every body it cannot read itself."""
    assert request.parse(body).doc == json.loads(body)


def test_body_parse_errors_are_json_loads_errors() -> None:
    """A bad body's 400 quotes json.loads's own message, not the fast path's."""
    body = b'{"model": "m"} trailing'
    with pytest.raises(ValueError) as expected:
        json.loads(body)
    with pytest.raises(errors.ApiError) as got:
        request.parse(body)
    assert str(expected.value) in got.value.message


def test_histogram_buckets_match_prometheus_client() -> None:
    """A value on a bucket's bound counts in that bucket (le), as prometheus_client counts it."""
    bounds = (0.1, 0.5, 1.0)
    ours = metrics.Histogram(bounds)
    registry = prom.CollectorRegistry()
    theirs = prom.Histogram("h", "h", buckets=bounds, registry=registry)
    for value in (0.05, 0.1, 0.3, 0.5, 1.0, 7.0):
        ours.observe(value)
        theirs.observe(value)
    buckets, total = ours.samples()
    for le, count in buckets:
        assert registry.get_sample_value("h_bucket", {"le": le}) == count
    assert total == pytest.approx(registry.get_sample_value("h_sum"))


def test_response_headers_are_looked_up_in_any_case() -> None:
    """Relay code written against aiohttp asks for "Content-Type"; the parser stores lower case."""
    headers = client.Headers({"content-type": "text/event-stream"})
    assert headers.get("Content-Type") == "text/event-stream" and "CONTENT-TYPE" in headers
    assert headers["Content-type"] == "text/event-stream" and headers.get("X-Missing", "d") == "d"


class _Connection:
    """What a Response asks of its connection: a read timeout, and abandoning it when closed early."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []
        self.abandoned = False

    def set_read_timeout(self, seconds: float) -> None:
        self.timeouts.append(seconds)

    def abandon(self) -> None:
        self.abandoned = True

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def test_response_hooks_run_once_each() -> None:
    """The Forwarder's hooks: the first byte once (then the idle timeout), done once, whichever ends it."""
    connection = _Connection()
    response = client.Response(200, client.Headers(), connection)  # type: ignore[arg-type]
    calls: list[str] = []
    response.on_first_byte = lambda: calls.append("first")
    response.on_done = lambda: calls.append("done")
    response.idle_timeout_s = 300.0
    response.body_started()
    response.body_started()  # harmless again
    assert calls == ["first"] and connection.timeouts == [300.0, 300.0]
    response.close()
    response.close()
    assert calls == ["first", "done"] and connection.abandoned


def test_a_response_closed_before_its_first_byte_still_says_so() -> None:
    """A stream cut before its first token: the policy's ``done`` runs anyway, before the in-flight count drops."""
    response = client.Response(200, client.Headers(), _Connection())  # type: ignore[arg-type]
    calls: list[str] = []
    response.on_first_byte = lambda: calls.append("first")
    response.on_done = lambda: calls.append("done")
    response.close()
    assert calls == ["first", "done"]
