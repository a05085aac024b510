"""The router's metrics summed over workers (``router.metricsmerge``), on real ``metrics.render()`` outputs.

Two workers are two loads of the router's own module-level counters (swapped in with monkeypatch), each
rendered as a worker's push would be; then a hub with a real ``MetricsPush`` on each side, over HTTP.
"""

from __future__ import annotations

import asyncio

import aiohttp
import prometheus_client as prom
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from llmgw.router import hub, metrics, metricsmerge, metricspush
from llmgw.testing.aioserve import serving

SECRET = "s3cret-of-the-hub"
WORKER = {"Authorization": f"Bearer {SECRET}"}

ODD = 'a "quoted" \\ model\nwith a newline, {braces} and ünïcode'


async def nothing(path: str, body: bytes) -> web.Response:
    return web.json_response({})


def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty per-request counters, as a new worker process has."""
    monkeypatch.setattr(metrics, "_requests", {})
    monkeypatch.setattr(metrics, "_series", {})
    monkeypatch.setattr(metrics, "_usage", {})
    monkeypatch.setattr(metrics, "OVERHEAD", metrics.Histogram(metrics.OVERHEAD_BUCKETS))


def load(requests: dict[tuple[str, str, int], int], durations: dict[str, list[float]], in_flight: dict[str, int],
         ) -> str:
    for (model, replica, code), n in requests.items():
        for _ in range(n):
            metrics.count_request(model, replica, code)
    for model, seconds in durations.items():
        for s in seconds:
            metrics.series(model).duration.observe(s)
            metrics.OVERHEAD.observe(s / 1000)
    for model, n in in_flight.items():
        for _ in range(n):
            metrics.series(model).in_flight.inc()
    return metrics.render()[0].decode()


def two_workers(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    fresh(monkeypatch)
    a = load({("m", "m-1", 200): 7, ("m", "m-1", 500): 1, (ODD, "r", 200): 2}, {"m": [0.02, 0.3, 4.0]}, {"m": 2})
    fresh(monkeypatch)
    b = load({("m", "m-1", 200): 5, ("only-b", "b-1", 429): 3}, {"m": [0.3, 700.0], "only-b": [0.04]}, {"m": 1})
    return a, b


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def test_counters_histograms_and_gauges_are_summed_each_family_once(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_workers(monkeypatch)
    merged = metricsmerge.merge_texts([a, b]).decode()
    req = "llmgw_router_requests_total"
    assert value(merged, req, model="m", replica="m-1", code="200") == 12
    assert value(merged, req, model="m", replica="m-1", code="500") == 1
    assert value(merged, req, model="only-b", replica="b-1", code="429") == 3  # a family only one worker has
    assert value(merged, req, model=ODD, replica="r", code="200") == 2  # odd characters survive both ways
    dur = "llmgw_router_request_duration_seconds"
    assert value(merged, dur + "_count", model="m") == 5
    assert value(merged, dur + "_sum", model="m") == pytest.approx(0.02 + 0.3 + 4.0 + 0.3 + 700.0)
    assert value(merged, dur + "_bucket", model="m", le="0.025") == 1
    assert value(merged, dur + "_bucket", model="m", le="0.5") == 3
    assert value(merged, dur + "_bucket", model="m", le="600.0") == 4
    assert value(merged, dur + "_bucket", model="m", le="+Inf") == 5
    assert value(merged, dur + "_count", model="only-b") == 1
    assert value(merged, "llmgw_router_overhead_seconds_count") == 6
    assert value(merged, "llmgw_router_requests_in_flight", model="m") == 3
    # Counters made by prometheus_client (retries) are in both: twice one worker's, no _created sums.
    for family in text_string_to_metric_families(a):
        for sample in family.samples:
            if sample.name.startswith("llmgw_router_retries_total"):
                assert value(merged, sample.name, **sample.labels) == 2 * sample.value
    assert "_created" not in merged
    # Each family once, with its HELP and TYPE, as Prometheus requires of one exposition.
    types = [line.split()[2] for line in merged.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    assert f"# TYPE {req} counter" in merged and f"# TYPE {dur} histogram" in merged
    assert f"# HELP {req} {metrics.REQUESTS_DOC}" in merged
    # A histogram's samples stay together per label set: its buckets, then count and sum, for one model.
    names = [line.split("{")[0] for line in merged.splitlines() if line.startswith(dur) and 'model="only-b"' in line]
    assert names == [dur + "_bucket"] * (len(metrics.DURATION_BUCKETS) + 1) + [dur + "_count", dur + "_sum"]


def test_one_workers_text_comes_back_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = two_workers(monkeypatch)
    again = metricsmerge.merge_texts([a]).decode()
    without_created = [line for line in a.splitlines() if "_created" not in line]
    assert again.splitlines() == without_created


def test_a_stale_worker_is_dropped_and_a_restarted_one_replaces_its_old_snapshot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_workers(monkeypatch)
    now = [100.0]
    kept = metricsmerge.Snapshots(stale_s=30.0, clock=lambda: now[0])
    kept.put("edge.w0", a)
    kept.put("edge.w1", b)
    req = "llmgw_router_requests_total"
    assert value(kept.merged().decode(), req, model="m", replica="m-1", code="200") == 12
    kept.put("edge.w0", b)  # restarted: its new counts replace the old ones
    assert value(kept.merged().decode(), req, model="m", replica="m-1", code="200") == 10
    now[0] += 20.0
    kept.put("edge.w1", a)
    now[0] += 15.0  # w0 silent for 35 s
    assert value(kept.merged().decode(), req, model="m", replica="m-1", code="200") == 7
    with pytest.raises(ValueError):
        kept.put("edge.w2", "not { an exposition")


def test_the_servers_collector_sums_the_in_process_registry_with_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_workers(monkeypatch)  # the in-process router's counters are b's now
    kept = metricsmerge.Snapshots()
    kept.put("server-x.w0", a)
    registry = prom.CollectorRegistry(support_collectors_without_names=True)
    registry.register(metricsmerge.Merged(metrics.REGISTRY, kept))
    merged = prom.generate_latest(registry).decode()
    assert value(merged, "llmgw_router_requests_total", model="m", replica="m-1", code="200") == 12
    types = [line.split()[2] for line in merged.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    restricted = prom.generate_latest(registry.restricted_registry(["llmgw_router_requests_total"])).decode()
    assert value(restricted, "llmgw_router_requests_total", model="only-b", replica="b-1", code="429") == 3


def test_workers_push_to_the_hub_and_a_scrape_reads_their_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_workers(monkeypatch)
    texts = iter([(a.encode(), ""), (b.encode(), "")])
    monkeypatch.setattr(metrics, "render", lambda: (next(texts)[0], prom.CONTENT_TYPE_LATEST))

    async def main() -> None:
        async with serving(hub.app(SECRET, hub.Feed(), nothing)) as url:
            pushes = [metricspush.MetricsPush(f"edge.w{i}", lambda: url, headers=WORKER, interval_s=60)
                      for i in range(2)]
            for p in pushes:
                await p.start()
            try:
                await asyncio.sleep(0.3)  # each pushed once on start
                monkeypatch.setattr(metrics, "render", lambda: (a.encode(), prom.CONTENT_TYPE_LATEST))
                body, content_type = await pushes[0].scrape()
                assert content_type == prom.CONTENT_TYPE_LATEST
                text = body.decode()
                assert value(text, "llmgw_router_requests_total", model="m", replica="m-1", code="200") == 12
                async with aiohttp.ClientSession() as http, http.get(url + metricsmerge.MERGED_PATH) as resp:
                    assert resp.status == 401  # the workers' secret only
            finally:
                for p in pushes:
                    await p.stop()
        # The hub gone: the worker answers its own, said to be one worker's.
        lone = metricspush.MetricsPush("edge.w0", lambda: url, headers=WORKER)
        await lone.start()
        try:
            body, _ = await lone.scrape()
        finally:
            await lone.stop()
        assert body.startswith(b"# The hub did not answer: these are one worker's (edge.w0)")
        assert value(body.decode(), "llmgw_router_requests_total", model="m", replica="m-1", code="200") == 7

    asyncio.run(main())
