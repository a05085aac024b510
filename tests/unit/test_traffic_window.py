"""The overview's router traffic: parsing the router's metrics, rates and TTFT quantiles between reads."""

from __future__ import annotations

import math

import pytest

from llmgw.control.ui import traffic


def _body(requests: dict[tuple[str, str], int], ttft: dict[str, dict[str, int]]) -> str:
    lines = ["# HELP llmgw_router_requests_total Requests answered", "# TYPE llmgw_router_requests_total counter"]
    lines += [f'llmgw_router_requests_total{{model="{m}",replica="r1",code="{c}"}} {n}.0'
              for (m, c), n in requests.items()]
    lines += ["# HELP llmgw_router_time_to_first_token_seconds TTFT",
              "# TYPE llmgw_router_time_to_first_token_seconds histogram"]
    for m, buckets in ttft.items():
        lines += [f'llmgw_router_time_to_first_token_seconds_bucket{{le="{le}",model="{m}"}} {n}.0'
                  for le, n in buckets.items()]
    return "\n".join(lines) + "\n"


def test_parse_counts_requests_and_errors_by_model() -> None:
    """Requests add up over replicas and codes; 400 and above are errors; model "" is the unknown model."""
    s = traffic.parse(_body({("a", "200"): 5, ("a", "503"): 2, ("", "404"): 1, ("b", "200"): 3}, {}), at=1.0)
    assert s.requests == {"a": 7, traffic.UNKNOWN: 1, "b": 3}
    assert s.errors == {"a": 2, traffic.UNKNOWN: 1}


def test_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    """histogram_quantile's answer: linear in the bucket, the largest finite bound in +Inf, None when empty."""
    cum = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, math.inf: 100.0}
    assert traffic.quantile(0.5, cum) == pytest.approx(0.1)
    assert traffic.quantile(0.7, cum) == pytest.approx(0.3)
    assert traffic.quantile(0.99, cum) == pytest.approx(0.95)
    assert traffic.quantile(0.99, {0.1: 0.0, math.inf: 4.0}) == pytest.approx(0.1)
    assert traffic.quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None


def test_the_first_read_has_no_rate_and_the_next_one_does() -> None:
    """One read gives totals only; a second gives the rate, errors and TTFT of what came between them."""
    sampler = traffic.Sampler()
    first = sampler.add(traffic.parse(_body({("a", "200"): 10}, {"a": {"0.1": 10, "1.0": 10, "+Inf": 10}}), at=100.0))
    assert first.window_s is None and first.ever == 10
    later = sampler.add(traffic.parse(_body({("a", "200"): 30, ("a", "500"): 2, ("", "404"): 1},
                                            {"a": {"0.1": 10, "1.0": 30, "+Inf": 30}}), at=110.0))
    assert later.window_s == 10.0 and later.ever == 33
    (a, unknown) = later.rows
    assert (a.model, a.requests, a.errors, a.rate_per_s) == ("a", 22, 2, 2.2)
    assert a.ttft_p50_s == pytest.approx(0.55) and a.ttft_p99_s == pytest.approx(0.991)  # only the 20 new ones
    assert (unknown.model, unknown.errors, unknown.ttft_p50_s) == (traffic.UNKNOWN, 1, None)
    assert (later.total.requests, later.total.errors) == (23, 3)


def test_the_window_keeps_a_minute_and_survives_a_router_restart() -> None:
    """Reads older than the window are dropped (the rate is the last minute's); a counter that fell counts from 0."""
    sampler = traffic.Sampler(window_s=60.0)
    for t, n in ((0.0, 0), (30.0, 600), (61.0, 1220), (90.0, 1800)):
        out = sampler.add(traffic.parse(_body({("a", "200"): n}, {}), at=t))
    assert out.window_s == 60.0 and out.total.rate_per_s == pytest.approx(20.0)  # 1800-600 over 30..90
    restarted = sampler.add(traffic.parse(_body({("a", "200"): 5}, {}), at=95.0))
    assert restarted.total.requests == 5
