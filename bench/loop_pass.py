"""One control-loop pass at N simulated nodes, as ``llmgw server`` runs it: store on its thread, the pure part
in a worker thread, then the sends and the table.

    .venv/bin/python bench/loop_pass.py --nodes 10000 --models 100 --replicas 10 [--tree /tmp/before]

N nodes register (CPU nodes with the sim engine, through ``Cluster.node_registered`` with an in-memory
link that records what it is sent), the models are applied, passes run until every replica is placed
and reported Ready, then ``--passes`` steady passes are timed (wall time of ``Cluster.reconcile_pass``
plus the table's publish). ``--tree`` runs another checkout's llmgw (``git worktree add /tmp/before REV``):
the script re-executes itself with that tree first on ``PYTHONPATH``; run it for both trees alternately
to compare, as ``bench/README.md`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class Link:
    """An agent's stream that records nothing but counts what it was sent (what the executor calls)."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def start_shard(self, spec: Any) -> None:
        self.started.append(spec)

    def stop_shard(self, shard_id: str, *, reason: str) -> None: ...
    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None: ...
    def remove_weights(self, cache_name: str) -> None: ...
    def provision(self, provision: Any) -> None: ...
    def controlplanes(self, addrs: tuple[str, ...]) -> None: ...
    def close(self, reason: str) -> None: ...

    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> Any:
        raise NotImplementedError

    def cancel_logs(self, request_id: str) -> None: ...
    def fabric_test(self, req: Any) -> Any: raise NotImplementedError
    def forget_fabric_test(self, test_id: str) -> None: ...


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _publish(c: Any) -> None:
    """The table's publish after a pass: ``c.table.update()`` since issue 25, ``c._publish_table()`` before."""
    table = getattr(c, "table", None)
    await (table.update() if table is not None and hasattr(table, "update") else c._publish_table())


async def _measure(ns: argparse.Namespace, data: Path) -> dict[str, float]:
    from llmgw.control.cluster import Cluster
    from llmgw.control.reconcile import decide
    from llmgw.control.store.offloop import StoreThread
    from llmgw.control.store.store import Store, StoredNode
    from llmgw.core import specs
    from llmgw.core.inventory import Inventory
    from llmgw.core.shards import ShardState, ShardStatus

    store = Store.open(data)
    db = StoreThread(store)
    c = Cluster(store, cfg=decide.Config(node_grace_s=1e9), heartbeat_timeout_s=1e9, db=db)
    db.watch_loop()
    inv = Inventory(cpu_count=64, memory_total_bytes=512 << 30, memory_available_bytes=500 << 30,
                    engines=(("sim", "1"),))
    links: dict[str, Link] = {}
    for i in range(ns.nodes):
        node = f"n{i:05d}"
        links[node] = Link()
        c.node_registered(StoredNode(node, node, "127.0.0.1", "0", inv, {}, 0.0, 0.0), [], links[node])
    for m in range(ns.models):
        model = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": f"m{m:03d}"},
                                      "spec": {"engine": "sim", "replicas": ns.replicas}})
        await db.call(store.put_model, model)
    reported: set[str] = set()
    for _ in range(20):  # place, start, report Ready
        await c.reconcile_pass()
        await _publish(c)
        for node, link in links.items():
            for spec in link.started:
                if spec.shard_id not in reported:
                    reported.add(spec.shard_id)
                    c.shard_reported(node, ShardStatus(spec.shard_id, spec.replica_id, ShardState.READY,
                                                       endpoint=f"http://127.0.0.1:1/{spec.shard_id}"))
        ready = await db.call(lambda: sum(1 for r in store.list_replicas() if r.phase.name == "READY"))
        if ready >= ns.models * ns.replicas:
            break
    times: list[float] = []
    for _ in range(ns.passes):
        t0 = time.perf_counter()
        await c.reconcile_pass()
        await _publish(c)
        times.append(time.perf_counter() - t0)
    await c.close()
    db.close()
    store.close()
    return {"nodes": ns.nodes, "replicas_ready": ready, "pass_p50_ms": statistics.median(times) * 1e3,
            "pass_p90_ms": _pct(times, 0.9) * 1e3, "pass_max_ms": max(times) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=10, help="replicas per model")
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--tree", default="", help="run this checkout's llmgw instead of this one's")
    ap.add_argument("--label", default="")
    ns = ap.parse_args()
    if ns.tree and os.environ.get("LLMGW_BENCH_TREE") != ns.tree:
        env = {**os.environ, "PYTHONPATH": ns.tree, "LLMGW_BENCH_TREE": ns.tree}
        return subprocess.call([sys.executable, __file__, *sys.argv[1:]], env=env, cwd=ns.tree)
    import llmgw

    with tempfile.TemporaryDirectory(prefix="llmgw-loop-pass-") as d:
        row = asyncio.run(_measure(ns, Path(d)))
    label = ns.label or (Path(ns.tree).name if ns.tree else "this tree")
    print(f"| {label} | {row['nodes']} | {row['replicas_ready']} | {row['pass_p50_ms']:.1f} | "
          f"{row['pass_p90_ms']:.1f} | {row['pass_max_ms']:.1f} |  ({Path(llmgw.__file__).parent})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
