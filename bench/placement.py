"""How long one reconcile pass takes to place N pending replicas on M nodes (the pure function alone).

    .venv/bin/python bench/placement.py --nodes 10000 --replicas 10000
"""

from __future__ import annotations

import argparse
import time

from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Inventory
from llmgw.core.specs import ModelSpec, Resources

GIB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=2000)
    ap.add_argument("--models", type=int, default=20)
    ns = ap.parse_args()
    nodes = {f"n{i:05d}": NodeView(f"n{i:05d}", Inventory(cpu_count=64, memory_total_bytes=512 * GIB,
                                                          memory_available_bytes=(256 + i % 7) * GIB,
                                                          engines=(("sim", "1"),)), connected=True, reported=True)
             for i in range(ns.nodes)}
    per = ns.replicas // ns.models
    models = {f"m{j}": ModelSpec(engine="sim", served_name=f"m{j}", replicas=per,
                                 resources=Resources(memory_bytes=4 * GIB, cpu_threads=2)) for j in range(ns.models)}
    replicas = [ReplicaRecord(f"m{j}-{k}", f"m{j}", models[f"m{j}"].fingerprint(), Phase.PENDING, "key",
                              created_at=float(k)) for j in range(ns.models) for k in range(per)]
    t0 = time.perf_counter()
    out = decide.reconcile(models, replicas, nodes, now=1000.0)
    took = time.perf_counter() - t0
    starts = sum(1 for x in out if isinstance(x, d.StartShard))
    print(f"placed {starts} of {len(replicas)} pending replicas on {len(nodes)} nodes in one pass: {took:.3f} s")


if __name__ == "__main__":
    main()
