"""The control plane's merge of routers' load reports (``control.loadreports.RouterSignals``), on a stepped clock."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.control import loadreports
from llmgw.core import autoscale
from llmgw.testing import stepped

BUCKETS = len(autoscale.TTFT_BUCKETS_MS) + 1


def report(router: str, *models: dict[str, Any], interval_s: float = 2.0) -> dict[str, Any]:
    return {"router": router, "interval_s": interval_s, "sent_at": 0.0, "models": list(models)}


def entry(model: str = "m", **kw: Any) -> dict[str, Any]:
    return {"model": model, "arrived": 0, "waiting": 0, "in_flight": 0, "held": 0, "ttft_counts": [0] * BUCKETS,
            "tokens_out": 0, "last_request_at": 0.0, "replicas": {}, **kw}


def ttft(bucket: int, n: int) -> list[int]:
    counts = [0] * BUCKETS
    counts[bucket] = n
    return counts


def test_two_routers_are_merged_gauges_summed_and_counts_over_the_window() -> None:
    """Gauges add up over routers; arrivals and tokens are rates over the window; TTFT merges the histograms."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock, window_s=10.0)
    for _ in range(5):  # 10 s of reports from both routers
        clock.now += 2
        sig.record(report("r1", entry(arrived=4, waiting=3, in_flight=5, tokens_out=100, ttft_counts=ttft(1, 4),
                                      last_request_at=clock.now - 1, replicas={"m-a": {"in_flight": 5}})))
        sig.record(report("r2", entry(arrived=2, waiting=1, in_flight=2, tokens_out=50, ttft_counts=ttft(9, 2),
                                      last_request_at=clock.now - 0.5,
                                      replicas={"m-a": {"in_flight": 1}, "m-b": {"in_flight": 1}})))
    s = sig.signals("m", clock.now)
    assert s is not None
    assert (s.waiting, s.in_flight, s.wanted) == (4.0, 7.0, False)
    assert s.arrived_per_s == pytest.approx(4 / 2 + 2 / 2)
    assert s.tokens_per_s == pytest.approx(100 / 2 + 50 / 2)
    assert s.last_request_at == clock.now - 0.5
    # 20 of 30 first tokens in (25, 50] ms, 10 in (1500, 2000]: the p90 lies in the slow bucket.
    assert s.ttft_p90_ms is not None and 1500 < s.ttft_p90_ms <= 2000
    assert sig.replica_load("m") == {"m-a": 6.0, "m-b": 1.0}
    assert sig.load() == {"m-a": 6.0, "m-b": 1.0}
    assert sig.routers(now=clock.now) == ["r1", "r2"]


def test_counts_older_than_the_window_no_longer_count() -> None:
    """A burst leaves the rates once it is older than the window; a quiet router's rate reads 0."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock, window_s=10.0, stale_after_s=1e9)
    clock.now += 2
    sig.record(report("r1", entry(arrived=40, tokens_out=400, ttft_counts=ttft(3, 40))))
    burst = sig.signals("m", clock.now)
    assert burst is not None and burst.arrived_per_s == pytest.approx(40 / 2) and burst.ttft_p90_ms is not None
    for _ in range(6):
        clock.now += 2
        sig.record(report("r1"))  # nothing more to say about m
    later = sig.signals("m", clock.now)
    assert later is not None and (later.arrived_per_s, later.tokens_per_s, later.ttft_p90_ms) == (0.0, 0.0, None)


def test_a_router_that_stops_reporting_ages_out() -> None:
    """A silent router's gauges stop counting after stale_after_s; with no live router the signals are None."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock, window_s=30.0, stale_after_s=10.0)
    sig.record(report("r1", entry(waiting=30, in_flight=8, replicas={"m-a": {"in_flight": 8}})))
    sig.record(report("r2", entry(waiting=1)))
    for _ in range(3):
        clock.now += 4
        sig.record(report("r2", entry(waiting=1)))
    s = sig.signals("m", clock.now)
    assert s is not None and (s.waiting, s.in_flight) == (1.0, 0.0)  # r1 said nothing for 12 s
    assert sig.replica_load("m") == {}
    clock.now += 11
    assert sig.signals("m", clock.now) is None  # nobody reports: the autoscaler holds


def test_a_model_left_out_of_a_report_has_its_gauges_at_zero() -> None:
    """Left out means nothing to say and all gauges 0: the last waiting count does not linger."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock)
    sig.record(report("r1", entry(waiting=5, in_flight=2, last_request_at=999.0)))
    clock.now += 2
    sig.record(report("r1"))
    s = sig.signals("m", clock.now)
    assert s is not None and (s.waiting, s.in_flight, s.last_request_at) == (0.0, 0.0, 999.0)


def test_a_held_request_wakes_the_model_at_once() -> None:
    """A report holding a request calls on_wake with the model, and the merged signals say wanted."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock)
    woken: list[str] = []
    sig.on_wake = woken.append
    sig.record(report("r1", entry("cold", held=1, waiting=1), entry("warm", in_flight=1)))
    assert woken == ["cold"]
    cold = sig.signals("cold", clock.now)
    assert cold is not None and cold.wanted and cold.waiting == 1.0
    assert sig.signals("never-seen", clock.now) == autoscale.Signals(0.0, 0.0, 0.0, None, 0.0, 0.0)


def test_a_queue_that_forms_kicks_a_pass_once() -> None:
    """Requests starting to wait at a router call on_wake once; a queue that stays does not call it again."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock)
    woken: list[str] = []
    sig.on_wake = woken.append
    sig.record(report("r1", entry("m", in_flight=4)))
    assert woken == []
    sig.record(report("r1", entry("m", in_flight=4, waiting=2)))
    assert woken == ["m"]
    sig.record(report("r1", entry("m", in_flight=4, waiting=5)))
    assert woken == ["m"]
    sig.record(report("r1", entry("m", in_flight=4)))
    sig.record(report("r1", entry("m", in_flight=4, waiting=1)))
    assert woken == ["m", "m"]


def test_a_router_clock_ahead_does_not_keep_a_model_busy() -> None:
    """A last_request_at in the future is read as now: the model can still go idle."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock)
    sig.record(report("r1", entry(last_request_at=clock.now + 3600)))
    s = sig.signals("m", clock.now)
    assert s is not None and s.last_request_at == clock.now


@pytest.mark.parametrize(("doc", "said"), [
    ([], "body: expected an object"),
    ({"models": []}, "router: expected the reporting router's id"),
    (report("r1", interval_s=0), "interval_s: expected how often"),
    ({"router": "r1", "models": {}}, "models: expected a list"),
    (report("r1", entry(model="")), "models[0].model: expected the model's name"),
    (report("r1", entry(), entry()), "models[1].model: 'm' is reported twice"),
    (report("r1", entry(arrived=-1)), "models[0].arrived: expected a whole number >= 0"),
    (report("r1", entry(arrived=1.5)), "models[0].arrived: expected a whole number >= 0"),
    (report("r1", entry(waiting="3")), "models[0].waiting: expected a number >= 0"),
    (report("r1", entry(in_flight=float("nan"))), "models[0].in_flight: expected a number >= 0"),
    (report("r1", entry(held=True)), "models[0].held: expected a number >= 0"),
    (report("r1", entry(ttft_counts=[1, 2])), f"models[0].ttft_counts: expected a list of {BUCKETS} counts"),
    (report("r1", entry(ttft_counts=[-1] + [0] * (BUCKETS - 1))), "models[0].ttft_counts[0]: expected a whole"),
    (report("r1", entry(replicas={"m-a": 3})), "models[0].replicas['m-a']: expected a replica id"),
    (report("r1", entry(replicas={"m-a": {"in_flight": -2}})), "models[0].replicas['m-a'].in_flight: expected"),
    (report("r1", *[entry(f"m{i}") for i in range(1001)]), "models: at most 1000 per report"),
])
def test_a_bad_report_is_refused_with_a_sentence_and_changes_nothing(doc: Any, said: str) -> None:
    """Every malformed field is named; nothing of a refused report is applied, not even its valid parts."""
    clock = stepped.Clock()
    sig = loadreports.RouterSignals(clock=clock)
    woken: list[str] = []
    sig.on_wake = woken.append
    if isinstance(doc, dict) and isinstance(doc.get("models"), list) and doc["models"]:
        doc["models"].insert(0, entry("good", held=1, waiting=4))
        said = said.replace("models[0]", "models[1]").replace("models[1].model: 'm'", "models[2].model: 'm'")
    with pytest.raises(loadreports.BadReport) as e:
        sig.record(doc)
    assert said in str(e.value)
    assert sig.signals("good", clock.now) is None and woken == []
