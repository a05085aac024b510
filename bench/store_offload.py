"""Store calls off the event loop, two ways: our own store thread against SQLAlchemy's asyncio over aiosqlite.

    .venv/bin/python bench/store_offload.py
    pip install --target /tmp/aiosqlite aiosqlite greenlet     # not project dependencies
    PYTHONPATH=/tmp/aiosqlite taskset -c 1 .venv/bin/python bench/store_offload.py

One SQLite file as ``llmgw server`` holds it (100 models, ``--replicas`` replicas,
10,000 events), three ways to make the server's calls from a coroutine:

* **on loop**: ``Store``'s method called in the coroutine (the code before this change);
* **thread**: ``StoreThread`` (``llmgw.control.store.offloop``): the whole call on one thread;
* **aiosqlite**: SQLAlchemy's asyncio extension over aiosqlite, the same queries and the
  same row-to-object code: SQLite's work on aiosqlite's thread, SQLAlchemy's ORM on the
  loop (in a greenlet). Skipped with the reason when aiosqlite or greenlet is missing.

For each of ``get_model`` (one small row), ``list_replicas`` and ``list_events``
(500 a page): the mean time of a call awaited back to back (per-call cost, the
hand-off included), and, while calls run back to back, how late a 1 ms sleep on
the same loop wakes: its p99 and max is how long the loop is held. ``--rounds``
rounds of ``--seconds`` each, the ways in turn; the median round is shown (max: the worst).
This script speaks SQL itself for the aiosqlite variant only: it is a measurement,
the server does not use it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from llmgw.control.events import Event
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.core import specs


def populate(store: Store, replicas: int) -> None:
    for i in range(100):
        store.put_model(specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model",
                                              "metadata": {"name": f"m{i:03d}"},
                                              "spec": {"engine": "sim", "replicas": 10}}))
    store.write_replicas(upserts=[
        ReplicaRecord(id=f"m{i % 100:03d}-{i:06x}", model=f"m{i % 100:03d}", fingerprint="f" * 16, phase=Phase.READY,
                      api_key="sk-" + "k" * 32, node_id=f"sim-{i:05d}", shard_id=f"m-{i:06x}-1", attempt=1,
                      endpoint="http://10.0.0.1:8000", last_output=("line one", "line two"), created_at=float(i),
                      gpus=(0, 1)) for i in range(replicas)])
    for start in range(0, 10_000, 1000):
        store.add_events([Event(float(start + i), "Normal", "NodeRegistered", f"node/sim-{start + i:05d}",
                                "registered: 64 CPUs, 8 GPUs, 0 shards running", node=f"sim-{start + i:05d}")
                          for i in range(1000)])


class AioStore:
    """The same three reads through SQLAlchemy's asyncio extension and aiosqlite."""

    def __init__(self, path: Path) -> None:
        from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

        self.engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        self.session = async_sessionmaker(self.engine, expire_on_commit=False)

    async def get_model(self, name: str) -> Any:
        from llmgw.control.store.tables import ModelRow

        async with self.session() as s:
            row = await s.get(ModelRow, name)
            return store_mod.StoredModel(specs.parse_manifest(row.manifest), row.generation, row.created_at,
                                         row.updated_at) if row else None

    async def list_replicas(self) -> list[ReplicaRecord]:
        import sqlalchemy as sa

        from llmgw.control.store.tables import ReplicaRow
        from llmgw.control.store.workloads import replica_from_row

        async with self.session() as s:
            rows = await s.scalars(sa.select(ReplicaRow).order_by(ReplicaRow.created_at, ReplicaRow.id))
            return [replica_from_row(r) for r in rows]

    async def list_events(self, *, limit: int) -> list[Event]:
        import sqlalchemy as sa

        from llmgw.control.store.history import event_from_row
        from llmgw.control.store.tables import EventRow

        async with self.session() as s:
            rows = list(await s.scalars(sa.select(EventRow).order_by(EventRow.id.desc()).limit(limit)))
        return [event_from_row(r) for r in reversed(rows)]


async def measure(call: Callable[[], Awaitable[Any]], *, seconds: float) -> dict[str, float]:
    for _ in range(3):
        await call()  # warm: connections, statement caches
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        await call()
        n += 1
    per_call = (time.perf_counter() - t0) / n
    lates: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lates.append(time.perf_counter() - t - 0.001)

    tick = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        await call()
        await asyncio.sleep(0)  # the loop's other work gets its turn between calls, as in the server
    stop = True
    await tick
    lates.sort()
    lates = lates or [float("nan")]
    return {"per_call_ms": per_call * 1e3, "calls": n, "stall_p50_ms": statistics.median(lates) * 1e3,
            "stall_p99_ms": lates[int(0.99 * (len(lates) - 1))] * 1e3, "stall_max_ms": lates[-1] * 1e3}


async def run(ns: argparse.Namespace, path: Path, store: Store) -> list[tuple[str, str, dict[str, float]]]:
    db = StoreThread(store)
    ways: dict[str, dict[str, Callable[[], Awaitable[Any]]]] = {}

    async def sync(fn: Callable[[], Any]) -> Any:
        return fn()

    ways["on loop"] = {"get_model": lambda: sync(lambda: store.get_model("m050")),
                       "list_replicas": lambda: sync(store.list_replicas),
                       "list_events": lambda: sync(lambda: store.list_events(limit=500))}
    ways["thread"] = {"get_model": lambda: db.get_model("m050"), "list_replicas": db.list_replicas,
                      "list_events": lambda: db.list_events(limit=500)}
    aio = None
    try:
        import aiosqlite  # noqa: F401
        import greenlet  # noqa: F401
        aio = AioStore(path)
        ways["aiosqlite"] = {"get_model": lambda: aio.get_model("m050"),  # type: ignore[union-attr]
                             "list_replicas": aio.list_replicas,
                             "list_events": lambda: aio.list_events(limit=500)}  # type: ignore[union-attr]
    except ImportError as e:
        print(f"aiosqlite skipped: {e} (see the docstring for how to install it beside the project)")
    rows = []
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        # Rounds, the ways taking turns within each, so load from elsewhere on the machine falls
        # on all of them alike; the median round is reported.
        for _ in range(ns.rounds):
            for call in ("get_model", "list_replicas", "list_events"):
                for way, calls in ways.items():
                    runs.setdefault((call, way), []).append(await measure(calls[call], seconds=ns.seconds))
        for (call, way), rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            med["stall_max_ms"] = max(r["stall_max_ms"] for r in rs)
            rows.append((call, way, med))
            print(f"{call:14} {way:10} {med}", flush=True)
    finally:
        db.close()
        if aio is not None:
            await aio.engine.dispose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="per call kind, way and round: half timed, half with the ticker")
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-store-offload-") as tmp:
        store = Store.open(Path(tmp))
        populate(store, ns.replicas)
        # As the server's collector does (agentsvc/collector.py): what lives on is frozen, so a full
        # collection does not walk every module's objects; without this, its 50-80 ms pauses every
        # few hundred calls were the p99 of every way alike.
        gc.collect()
        gc.freeze()
        rows = asyncio.run(run(ns, Path(tmp) / "llmgw.db", store))
        store.close()
    print("\n| call | way | per call (ms) | loop held p99 / max (ms) |\n|---|---|---|---|")
    for call, way, r in rows:
        print(f"| {call} | {way} | {r['per_call_ms']:.2f} | {r['stall_p99_ms']:.2f} / {r['stall_max_ms']:.2f} |")


if __name__ == "__main__":
    main()
