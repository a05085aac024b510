"""What adapter affinity costs the router per request (issue 31 part 1): ``Forwarder._pick``, in-process.

    .venv/bin/python bench/adapter_affinity_cost.py                      # this tree
    PYTHONPATH=/work/main .venv/bin/python bench/adapter_affinity_cost.py  # a checkout before, to compare

Best and median µs per pick over ``--repeats`` runs, for ``--replicas`` replicas under least outstanding:

* ``model``: a model's request (no adapter): what every request that uses no adapter pays; affinity adds
  one attribute test here (``route.parent``), so this figure should not move between trees;
* ``adapter, held``: an adapter's request whose adapter is held by one replica (the usual case);
* ``adapter, cycling``: requests over ``--adapters`` adapters in turn, more than ``--slots`` fit in each
  replica, so the router's model of each cache evicts (the on-demand path).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

from llmgw.router import upstream
from llmgw.router.pick import NO_KEY
from llmgw.router.table import Endpoint, ModelRoute


def timed(fn: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs), statistics.median(runs)


def fmt(figures: tuple[float, float]) -> str:
    return f"best {figures[0]:.2f} µs, median {figures[1]:.2f} µs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--adapters", type=int, default=32)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    eps = tuple(Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(a.replicas))
    ids = [e.replica_id for e in eps]
    fwd = upstream.Forwarder()
    policy = fwd.policies["least_outstanding"]
    base = ModelRoute(name="base", served_name="base", endpoints=eps, routing="least_outstanding")
    fields = {f.name for f in dataclasses.fields(ModelRoute)}
    extra = {"adapter_slots": a.slots} if "adapter_slots" in fields else {}
    routes = [dataclasses.replace(base, name=f"l{i}", served_name=f"l{i}", parent="base", **extra)
              for i in range(a.adapters)]

    def pick(route: ModelRoute) -> object:
        return fwd._pick(policy, route, ids, NO_KEY, set(), set(), retried=False)

    print(f"{a.replicas} replicas, least_outstanding, {a.adapters} adapters, {a.slots} slots each")
    print("model (no adapter): " + fmt(timed(lambda: pick(base), a.calls, a.repeats)))
    print("adapter, held: " + fmt(timed(lambda: pick(routes[0]), a.calls, a.repeats)))
    turn = iter(range(10**12))
    print("adapter, cycling: " + fmt(timed(lambda: pick(routes[next(turn) % a.adapters]), a.calls, a.repeats)))


if __name__ == "__main__":
    main()
