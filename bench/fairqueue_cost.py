"""What priority classes and fair queuing (issue 32) cost the router: µs of CPU per request, this tree and another.

In process, like ``metering_cost.py --inproc``: non-streamed requests straight through the router's app (its ASGI
entry, a canned upstream answer, no socket), a key in a project, the model with a concurrency limit of 64 that one
request at a time never reaches (so admission runs, and no queue forms). Each case is a process of its own, the
best of five runs of N requests, the cases interleaved over ``--rounds`` (a slower minute of the machine falls on
all of them):

* ``plain``: a key with no class or weight (the feature unused);
* ``classed``: the key's project has a class and a weight (resolved once per table, not per request);
* ``header``: ``plain`` sending ``X-Llmgw-Priority: batch`` (the one per-request step: a header looked up);
* ``queue``: admission alone when a queue forms: 64 waiters in 8 projects behind a held slot, then admitted one
  by one; µs per waiter (``core.fairqueue`` against the heap it replaced, with ``--before``).

``--before TREE`` runs ``plain`` and ``queue`` on another checkout too (its ``llmgw`` on PYTHONPATH), the
feature's absence.

    .venv/bin/python bench/fairqueue_cost.py --n 20000 --rounds 3 --before /work/main
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from metering_cost import MODEL, CannedUpstream

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SECRET = "sk-fairq-bench"
CASES = ("plain", "classed", "header", "queue")


def table(mode: str) -> dict[str, object]:
    project: dict[str, object] = {"name": "bench", "limits": {}}
    if mode == "classed":
        project.update(priority_class="interactive", weight=2.0)
    return {"version": 1,
            "models": [{"name": MODEL, "served_name": MODEL, "state": "Ready", "routing": "round_robin",
                        "limits": {"concurrency": 64},
                        "endpoints": [{"replica_id": "r-bench", "url": "http://127.0.0.1:9", "node": "n"}]}],
            "auth": {"required": True, "projects": [project],
                     "keys": [{"id": "kbench", "sha256": hashlib.sha256(SECRET.encode()).hexdigest(),
                               "project": "bench"}]}}


async def requests(mode: str, n: int) -> float:
    """Best of five: µs of CPU per request through the app."""
    from llmgw.router import app as app_mod
    from llmgw.router import table as table_mod
    from llmgw.router.asgi import CANCELS

    holder = table_mod.TableHolder()
    holder.swap(table_mod.RouteTable.from_doc(table(mode)))
    app = app_mod.RouterApp(holder)
    app._proxy.forwarder = CannedUpstream()  # type: ignore[assignment]
    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = [(b"authorization", b"Bearer " + SECRET.encode()), (b"content-type", b"application/json"),
               (b"user-agent", b"bench"), (b"accept", b"*/*")]
    if mode == "header":
        headers.append((b"x-llmgw-priority", b"batch"))
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": headers,
             "extensions": {CANCELS: {}}}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        pass

    for _ in range(2000):
        await app(dict(scope), receive, send)
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            await app(dict(scope), receive, send)
        runs.append((time.process_time() - start) / n * 1e6)
    return min(runs)


async def queue(n: int) -> float:
    """Best of five: µs of CPU per waiter admitted from a formed queue (64 waiters, 8 projects)."""
    from llmgw.router import admission

    try:
        from llmgw.core.queueclasses import QueueAs
        flows = [{"queue_as": QueueAs(flow=f"project:p{i}", project=f"p{i}")} for i in range(8)]
    except ImportError:  # a tree before issue 32: its slot takes a priority only
        flows = [{} for _ in range(8)]

    async def one(adm: admission.Admission, kw: dict[str, object]) -> None:
        async with adm.slot("m", **kw):  # type: ignore[arg-type]
            pass

    async def burst(adm: admission.Admission) -> None:
        release = asyncio.Event()

        async def hold() -> None:
            async with adm.slot("m"):
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(one(adm, flows[i % 8])) for i in range(64)]
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(holder, *tasks)

    adm = admission.Admission(default_limit=1, max_queue=1000, max_wait_s=60)
    bursts = max(1, n // 64)
    for _ in range(20):
        await burst(adm)
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(bursts):
            await burst(adm)
        runs.append((time.process_time() - start) / (bursts * 64) * 1e6)
    return min(runs)


def one(case: str, n: int) -> float:
    return asyncio.run(queue(n) if case == "queue" else requests(case, n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="requests (or waiters) a run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout to measure plain and queue on")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]))))
        return 0
    runs = [("this", case, REPO) for case in CASES]
    if args.before:
        runs += [("before", case, args.before.resolve()) for case in ("plain", "queue")]
    got: dict[tuple[str, str], list[float]] = {(t, c): [] for t, c, _ in runs}
    for r in range(args.rounds):
        for tree, case, path in runs:
            env = {**os.environ, "PYTHONPATH": str(path)}
            out = subprocess.run([sys.executable, str(HERE / "fairqueue_cost.py"), "--one", case, str(args.n)],
                                 env=env, capture_output=True, text=True, check=True, cwd=HERE)
            got[(tree, case)].append(float(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {tree:6} {case:8} {got[(tree, case)][-1]:7.2f} us", flush=True)
    print(f"\nmedians of {args.rounds} rounds (each the best of 5 runs of {args.n}), µs of CPU per request "
          "(queue: per waiter admitted)")
    for (tree, case), values in got.items():
        print(f"  {tree:6} {case:8} {statistics.median(values):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
