"""What the UI's history costs (issue 30): bytes per model and node series, and µs to record a report.

    .venv/bin/python bench/history.py                  # 20,000 reports and heartbeats, 20 models, 50 nodes
    .venv/bin/python bench/history.py --reports 5000 --json /tmp/history.json

Measured in process on ``control.history.MetricsHistory`` (what the leader holds), with real documents:

* memory: ``Series.nbytes()`` (the rings' arrays) for a model and for a node with 0 and 8 GPUs, checked
  against the arithmetic in ``core.history``'s docstring, and the process's RSS growth (``tracemalloc``'s
  count of what the series allocated) for 20 models and 50 nodes of 8 GPUs;
* recording: µs per call of ``RouterSignals.apply`` with the history hooked (a router's ``LoadReport`` of
  ``--models`` models, as the control plane applies it) against the same without the hook, interleaved in
  rounds, and µs per ``MetricsHistory.heartbeat`` (an 8-GPU node) and per ``sample`` (every model's gauges
  and 200 shards), p50 of rounds;
* reading: ms per ``view`` of a model over 1 h and 24 h (what one chart fragment asks for).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from llmgw.api.routing import LoadReport, ModelLoad
from llmgw.control import history, loadreports
from llmgw.core import autoscale
from llmgw.core.inventory import Disk, Gpu, Heartbeat
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

ROUNDS = 7


def _report(models: int, i: int) -> LoadReport:
    counts = tuple((i + k) % 5 for k in range(len(autoscale.TTFT_BUCKETS_MS) + 1))
    return LoadReport("r1", models=tuple(ModelLoad(f"m{k}", arrived=10 + i % 7, errors=i % 2, tokens_in=300,
                                                   tokens_out=900, waiting=1, in_flight=3, ttft_counts=counts,
                                                   replicas={f"m{k}-a": 1.0, f"m{k}-b": 2.0})
                                         for k in range(models)))


def _heartbeat(gpus: int, i: int) -> Heartbeat:
    return Heartbeat(memory_total_bytes=512 << 30, memory_available_bytes=(400 << 30) - i, cpu_percent=i % 100,
                     gpus=tuple(Gpu(index=g, uuid=f"u{g}", name="H100", memory_total_bytes=80 << 30,
                                    memory_used_bytes=(g + 1) << 30, utilization_percent=(i + g) % 101)
                           for g in range(gpus)),
                     disks=(Disk("/", 2 << 40, 1 << 40),))


def _per_call_us(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=20_000)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict[str, object] = {}

    # -- memory ----------------------------------------------------------------------------------
    h = history.MetricsHistory()
    h.sample(1e9, {"m": (1.0, 1.0)}, ())
    h.heartbeat("n0", _heartbeat(0, 0), 1e9)
    h.heartbeat("n8", _heartbeat(8, 0), 1e9)
    model_b = h._series["model"]["m"].nbytes()
    node0_b, node8_b = h._series["node"]["n0"].nbytes(), h._series["node"]["n8"].nbytes()
    assert model_b == 1800 * (len(history.MODEL_FIELDS) * 4 + 6 * 4 + 8), model_b
    # 2 fields a GPU: its memory used and its utilisation.
    assert node0_b == 1800 * (3 * 8 + 8) and node8_b == 1800 * (19 * 8 + 8), (node0_b, node8_b)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    big = history.MetricsHistory()
    for k in range(20):
        big.sample(1e9, {f"m{k}": (1.0, 1.0)}, ())
    for n in range(50):
        big.heartbeat(f"n{n}", _heartbeat(8, n), 1e9)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    out["memory"] = {"model_series_bytes": model_b, "node_series_bytes_0_gpus": node0_b,
                     "node_series_bytes_8_gpus": node8_b, "traced_bytes_20_models_50_nodes_8_gpus": traced,
                     "arrays_bytes_20_models_50_nodes_8_gpus": big.nbytes()}

    # -- recording ---------------------------------------------------------------------------------
    n = args.reports
    reports = [_report(args.models, i) for i in range(64)]
    beats = [_heartbeat(8, i) for i in range(64)]
    shards = [ShardStatus(f"m{k % args.models}-{k}-1", f"m{k % args.models}-{k}",
                          ShardState.READY if k % 5 else ShardState.STARTING,
                          spec=ShardSpec(f"m{k % args.models}-{k}-1", f"m{k % args.models}-{k}", f"m{k % args.models}",
                                         "sim", "x")) for k in range(200)]
    clock = [1e9]
    gauges = {f"m{k}": (1.0, 2.0) for k in range(args.models)}
    with_hook: list[float] = []
    without: list[float] = []
    beat_us: list[float] = []
    sample_us: list[float] = []
    for _ in range(ROUNDS):
        for hooked, into in ((True, with_hook), (False, without)):
            sig = loadreports.RouterSignals(clock=lambda: clock[0])
            hist = history.MetricsHistory()
            if hooked:
                sig.on_report = hist.load_report

            def apply(i: int, sig: loadreports.RouterSignals = sig) -> None:
                clock[0] += 2.0
                sig.apply(reports[i % 64])
            into.append(_per_call_us(apply, n // ROUNDS))
        hist = history.MetricsHistory()
        beat_us.append(_per_call_us(lambda i, hist=hist: hist.heartbeat(f"n{i % 50}", beats[i % 64], 1e9 + i),
                                    n // ROUNDS))
        sample_us.append(_per_call_us(lambda i, hist=hist: hist.sample(1e9 + 2 * i, gauges, shards), 200))
    p50 = statistics.median
    out["record_us"] = {
        "load_report_with_history": round(p50(with_hook), 2), "load_report_without": round(p50(without), 2),
        "history_share_per_report": round(p50(with_hook) - p50(without), 2),
        "history_per_model_in_report": round((p50(with_hook) - p50(without)) / args.models, 2),
        "heartbeat_8_gpus": round(p50(beat_us), 2),
        f"sample_{args.models}_models_200_shards": round(p50(sample_us), 2),
    }

    # -- reading ---------------------------------------------------------------------------------
    reader = history.MetricsHistory()
    for i in range(8640):  # a day of reports, one every 10 s
        reader.load_report(reports[i % 64], 1e9 + 10 * i)
    now = 1e9 + 86400
    for label, window in (("1h", 3600), ("24h", 86400)):
        t0 = time.perf_counter()
        for _ in range(20):
            reader.view("model", "m0", window, now)
        out.setdefault("view_ms", {})[label] = round((time.perf_counter() - t0) / 20 * 1e3, 2)  # type: ignore[union-attr]
    out["args"] = {"reports": n, "models_per_report": args.models, "rounds": ROUNDS}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
