"""``control.history``: routers' reports, the loop's samples and heartbeats become charts; the REST read of them."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest

from llmgw.api.routing import LoadReport, ModelLoad
from llmgw.control import loadreports
from llmgw.control.auth import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.history import MODEL_FIELDS, MetricsHistory, ttft_quantiles
from llmgw.control.http.api import create_api
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.core import autoscale
from llmgw.core.inventory import Disk, Gpu, Heartbeat
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

T0 = 1_764_662_400.0  # a multiple of 60: buckets start on it


def ttft(ms: float, n: int) -> tuple[int, ...]:
    counts = [0] * (len(autoscale.TTFT_BUCKETS_MS) + 1)
    counts[next(i for i, b in enumerate(autoscale.TTFT_BUCKETS_MS) if ms <= b)] = n
    return tuple(counts)


def chart(view, title):  # type: ignore[no-untyped-def]
    return {ln.name: ln.values for c in view.charts if c.title == title for ln in c.lines}


def shard(rid: str, state: ShardState, n: int = 0) -> ShardStatus:
    spec = ShardSpec(shard_id=f"{rid}-{n}", replica_id=rid, model="m", engine="sim", served_name="m")
    return ShardStatus(shard_id=f"{rid}-{n}", replica_id=rid, state=state, spec=spec)


def test_router_reports_become_rates_errors_tokens_and_ttft_quantiles() -> None:
    now = [T0]
    h = MetricsHistory()
    sig = loadreports.RouterSignals(clock=lambda: now[0])
    sig.on_report = h.load_report
    # Two routers in the same 10 s bucket: their counts add up.
    sig.apply(LoadReport("r1", models=(ModelLoad("m", arrived=30, errors=2, tokens_in=600, tokens_out=900,
                                                 ttft_counts=ttft(100, 30)),)))
    now[0] = T0 + 4
    sig.apply(LoadReport("r2", models=(ModelLoad("m", arrived=20, tokens_out=100, ttft_counts=ttft(1000, 20)),)))
    view = h.view("model", "m", 60, T0 + 15)
    assert view is not None and view.step_s == 10 and view.times[-2] == T0 and len(view.times) == 6
    req = chart(view, "Requests")
    assert req["requests"][-2] == 5.0 and req["errors"][-2] == 0.2  # 50 and 2 over 10 s
    assert req["requests"][:-2] == (None,) * 4 and req["requests"][-1] is None  # nothing heard: gaps, not zeros
    tok = chart(view, "Tokens")
    assert tok["in"][-2] == 60.0 and tok["out"][-2] == 100.0
    q = chart(view, "Time to first token")
    assert q["p50"][-2] is not None and 50 < q["p50"][-2] <= 100  # 30 of 50 under 100 ms
    assert q["p99"][-2] is not None and 750 < q["p99"][-2] <= 1000
    # The bucket holding now has counted for 5 s, not 10: its rate is over those 5 s (no dip at the edge).
    partial = h.view("model", "m", 60, T0 + 5)
    assert partial is not None and chart(partial, "Requests")["requests"][-1] == 10.0
    assert h.view("model", "other", 60, T0) is None


def test_samples_count_replicas_by_their_worst_shard_and_average_the_queue() -> None:
    h = MetricsHistory()
    shards = [shard("m-a", ShardState.READY), shard("m-b", ShardState.READY, 0), shard("m-b", ShardState.STARTING, 1),
              shard("m-c", ShardState.FAILED), shard("m-d", ShardState.STOPPED)]
    h.sample(T0, {"m": (4.0, 2.0)}, shards)
    h.sample(T0 + 2, {"m": (2.0, 4.0)}, shards)
    view = h.view("model", "m", 300, T0 + 5)
    assert view is not None
    reps = chart(view, "Replicas")
    assert (reps["ready"][-1], reps["starting"][-1], reps["unhealthy"][-1], reps["draining"][-1]) == (1, 1, 1, 0)
    queue = chart(view, "Queue")
    assert queue["waiting"][-1] == 3.0 and queue["in flight"][-1] == 3.0
    assert chart(view, "Requests")["requests"][-1] == 0.0  # sampled: a known quiet, not a gap


def test_heartbeats_chart_cpu_memory_disk_and_each_gpu() -> None:
    h = MetricsHistory()
    gpus = tuple(Gpu(index=i, uuid=f"u{i}", name="H100", memory_total_bytes=80 << 30,
                     memory_used_bytes=(10 + i) << 30) for i in range(2))
    hb = Heartbeat(memory_total_bytes=64 << 30, memory_available_bytes=48 << 30, cpu_percent=37.5, gpus=gpus,
                   disks=(Disk("/", 100 << 30, 40 << 30), Disk("/data", 50 << 30, 50 << 30)))
    h.heartbeat("n1", hb, T0)
    view = h.view("node", "n1", 3600, T0 + 1)
    assert view is not None and len(view.times) == 360
    assert chart(view, "CPU")["cpu"][-1] == 37.5
    assert chart(view, "Memory used")["memory"][-1] == float(16 << 30)
    assert chart(view, "Disk used")["disk"][-1] == float(60 << 30)
    assert chart(view, "GPU memory") == {"gpu0 used": (None,) * 359 + (float(10 << 30),),
                                         "gpu1 used": (None,) * 359 + (float(11 << 30),)}
    # A day's window reads the minute tier, which the same heartbeat went into.
    day = h.view("node", "n1", 86400, T0 + 1)
    assert day is not None and day.step_s == 60 and chart(day, "CPU")["cpu"][-1] == 37.5


def test_the_caps_bound_the_series_and_a_busy_one_is_never_dropped_for_a_new_one() -> None:
    h = MetricsHistory(max_models=2, idle_s=600)
    for name in ("a", "b", "c"):
        h.sample(T0, {name: (1.0, 1.0)}, ())
    assert len(h) == 2 and h.view("model", "c", 60, T0) is None  # a and b written just now: c waits
    one = h.nbytes() // 2
    assert one == 1800 * (len(MODEL_FIELDS) * 4 + 6 * 4 + 8)
    h.sample(T0 + 700, {"b": (1.0, 1.0)}, ())
    h.sample(T0 + 700, {"c": (1.0, 1.0)}, ())  # a has been quiet for 700 s: c takes its place
    assert h.view("model", "a", 60, T0 + 700) is None and h.view("model", "c", 60, T0 + 700) is not None
    assert h.nbytes() == 2 * one


def test_the_rest_read_answers_a_typed_document_and_refuses_a_bad_window(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    cluster = Cluster(store, clock=lambda: T0 + 5)
    cluster.signals.record({"router": "r1", "interval_s": 2.0, "models": [
        {"model": "m", "arrived": 10, "errors": 1, "tokens_in": 5, "tokens_out": 20}]})
    db = StoreThread(store)
    app = create_api(db, cluster, auth=Auth.insecure())

    async def drive() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return [await c.get("/api/v1/metrics/history", params=p) for p in (
                {"scope": "model", "name": "m", "window": "5m"}, {"scope": "node", "name": "nope"},
                {"scope": "model", "name": "m", "window": "2d"})]

    try:
        ok, unknown, bad = asyncio.run(drive())
    finally:
        db.close()
    assert ok.status_code == 200, ok.text
    doc = ok.json()
    assert doc["recorded"] is True and doc["step_s"] == 10 and len(doc["times"]) == 30
    requests = next(c for c in doc["charts"] if c["title"] == "Requests")
    # 10 requests and 1 error in the bucket holding now, 5 s into it.
    assert requests["lines"][0]["values"][-1] == 2.0 and requests["lines"][1]["values"][-1] == 0.2
    assert unknown.status_code == 200 and unknown.json()["recorded"] is False and unknown.json()["charts"] == []
    assert bad.status_code == 422 and "window" in bad.text


def test_the_one_pass_quantiles_equal_the_autoscalers() -> None:
    rng = random.Random(30)
    n = len(autoscale.TTFT_BUCKETS_MS) + 1
    for _ in range(500):
        cells = [rng.choice((0, 0, 0, 1, 3, 40)) for _ in range(n)]
        got = ttft_quantiles([float(c) for c in cells])
        want = [autoscale.ttft_quantile(cells, q) for q in (0.5, 0.9, 0.99)]
        assert got == pytest.approx(want) if any(cells) else got == [None] * 3
