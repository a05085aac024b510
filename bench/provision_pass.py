"""What working out each node's engines costs the reconcile pass (issue 14): ``reconcile.engines.provisions``.

    .venv/bin/python bench/provision_pass.py                  # 10,000 nodes in 10 pools, 100 models
    .venv/bin/python bench/provision_pass.py --nodes 1000 --repeat 3

Plain data, in-process: the nodes as the cluster holds them (``NodeView``), one pool want, and 100 models of
which none, 10 or all 100 pin an ``engine_version`` (each to a pool of its own, a version no node has, so each
is wanted on its pool's nodes). Beside it, ``provision_for`` called per node: what the pass did first.
Reported: the best of ``--repeat`` runs of each, in ms.
"""

from __future__ import annotations

import argparse
import time

from llmgw.control.reconcile import engines as prov
from llmgw.control.state import NodeView
from llmgw.core.inventory import Inventory
from llmgw.core.specs import ModelSpec, Resources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pools", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    inv = Inventory(cpu_count=8, memory_total_bytes=1 << 36, memory_available_bytes=1 << 35,
                    engines=(("sim", "0.1"), ("llamacpp", "0.2.0")))
    nodes = [NodeView(f"n{i}", inv, connected=True, labels={"pool": f"p{i % a.pools}"}) for i in range(a.nodes)]
    wants = [prov.ScopedWant("pool:p1", "vllm", "0.11.2")]
    settings = prov.EngineSettings(index_url="http://127.0.0.1:9/simple")
    for pinned in (0, 10, 100):
        models = {f"m{j}": ModelSpec(engine="vllm", served_name=f"m{j}", resources=Resources(),
                                     engine_version=f"0.{j}", pool=f"p{j % a.pools}") for j in range(pinned)}
        models.update({f"u{j}": ModelSpec(engine="sim", served_name=f"u{j}", resources=Resources())
                       for j in range(100 - pinned)})
        per_node = indexed = float("inf")
        for _ in range(a.repeat):
            t = time.perf_counter()
            slow = {n.id: prov.provision_for(n, wants, models, settings) for n in nodes}
            per_node = min(per_node, time.perf_counter() - t)
            t = time.perf_counter()
            fast = prov.provisions(nodes, wants, models, settings)
            indexed = min(indexed, time.perf_counter() - t)
        assert fast == slow
        print(f"{a.nodes} nodes, {pinned:3d} of 100 models pinning a version: provisions {indexed * 1000:6.1f} ms, "
              f"provision_for per node {per_node * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
