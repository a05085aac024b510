"""How long one reconcile pass takes to place N pending replicas on M nodes (the pure function alone).

    .venv/bin/python bench/placement.py --nodes 10000 --replicas 10000
    .venv/bin/python bench/placement.py --nodes 10000 --replicas 10000 --models 1000 --gpus 8
    .venv/bin/python bench/placement.py --nodes 10000 --replicas 10000 --gpus 8 --remote

Half the models are CPU ones and half (with --gpus) want 1 or 2 GPUs with
20 GiB, tensor parallel where 2; every other model binpacks. The peer is the
same decisions by scanning every node for every replica (what placement did
before the index), run on the first --peer-replicas of them and scaled to the
same count; the two must also agree on where the first ones go.

With --remote every model's source is hf://, its metadata read already (14 GiB
each, so the disk filter runs for every node walked), every node has a weights
directory, and one node in ten holds or fetches some model's weights: what a
pass pays for remote weights. The peer is skipped then (it knows no disk).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from llmgw.control.placement import filters, fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Gpu, Inventory, ModelDir, WeightFile
from llmgw.core.shards import FetchProgress, ShardSpec, ShardState, ShardStatus
from llmgw.core.specs import Gpus, ModelSpec, Resources

GIB = 2**30


def cluster(n: int, gpus: int) -> dict[str, NodeView]:
    out = {}
    for i in range(n):
        gs = tuple(Gpu(g, f"u{i}-{g}", "H100", 80 * GIB, (g % 3) * GIB, "9.0",
                       tuple(p for p in range(gpus) if p != g)) for g in range(gpus))
        inv = Inventory(cpu_count=64, memory_total_bytes=512 * GIB, memory_available_bytes=(256 + i % 7) * GIB,
                        engines=(("sim", "1"),), gpus=gs)
        out[f"n{i:05d}"] = NodeView(f"n{i:05d}", inv, connected=True, reported=True)
    return out


def models(count: int, per: int, gpus: int, threads: int = 2) -> dict[str, ModelSpec]:
    out = {}
    for j in range(count):
        g = Gpus(count=1 + j % 2, memory_bytes=20 * GIB, tensor_parallel=1 + j % 2) if gpus and j % 2 else Gpus()
        out[f"m{j}"] = ModelSpec(engine="sim", served_name=f"m{j}", replicas=per,
                                 resources=Resources(memory_bytes=4 * GIB, cpu_threads=threads, gpus=g),
                                 placement="binpack" if j % 4 >= 2 else "spread")
    return out


def with_remote(specs: dict[str, ModelSpec], nodes: dict[str, NodeView]
                ) -> tuple[dict[str, ModelSpec], dict[str, NodeView], dict[str, fit.RemoteWeights]]:
    """hf:// sources read as 14 GiB each; 1 TiB free weights disks; every 10th node holds or fetches a model's."""
    names = sorted(specs)
    specs = {m: dataclasses.replace(s, source=f"hf://org/{m}") for m, s in specs.items()}
    remote = {f"hf://org/{m}": fit.RemoteWeights(WeightFile("", 14 * GIB, "safetensors", source=f"hf://org/{m}"))
              for m in names}
    out = {}
    for i, (nid, v) in enumerate(sorted(nodes.items())):
        src = f"hf://org/{names[i % len(names)]}"
        weights, shards = v.inventory.weights, v.shards
        if i % 20 == 0:
            weights = (WeightFile(f"/w/{i}", 14 * GIB, "safetensors", fetched_by_llmgw=True, source=src,
                                  cache_name=f"c{i}"),)
        elif i % 20 == 10:
            shards = {"x": ShardStatus("x", "x", ShardState.FETCHING, spec=ShardSpec("x", "x", "o", "sim", "o",
                                                                                     source=src),
                                       fetch=FetchProgress(GIB, 14 * GIB))}
        inv = dataclasses.replace(v.inventory, weights=weights,
                                  model_dirs=(ModelDir("/var/lib/llmgw/weights", 2048 * GIB, 1024 * GIB),))
        out[nid] = dataclasses.replace(v, inventory=inv, shards=shards)
    return specs, out, remote


def scan(placer: fit.Placer, model: str, spec: ModelSpec) -> str | None:
    """The peer: every node checked for every replica, best key kept."""
    need = placer.need(model, spec)
    held = placer.replicas_of(model)
    best: tuple[object, ...] | None = None
    for st in placer.states:
        if filters.static_reason(need, st.view) is not None or (free := filters.fits(need, st)) is None:
            continue
        k1, k2 = (st.unheld_gpus, st.free_memory) if need.gpu_count else (st.free_memory, st.free_threads)
        key = ((k1, k2, st.idx) if need.policy == "binpack" else (held.get(st.idx, 0), -k1, -k2, st.idx))
        if best is None or key < best[0]:
            best = (key, st, free)
    if best is None:
        return None
    return placer.take(best[1], need, best[2]).node_id  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=2000)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=0, help="GPUs per node (0: CPU-only cluster)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per replica (8 runs nodes out of "
                    "threads long before memory)")
    ap.add_argument("--peer-replicas", type=int, default=200)
    ap.add_argument("--remote", action="store_true", help="hf:// sources, weights disks, fetches in flight")
    ns = ap.parse_args()
    nodes = cluster(ns.nodes, ns.gpus)
    per = ns.replicas // ns.models
    specs = models(ns.models, per, ns.gpus, ns.threads)
    remote = None
    if ns.remote:
        specs, nodes, remote = with_remote(specs, nodes)
    replicas = [ReplicaRecord(f"m{j}-{k}", f"m{j}", specs[f"m{j}"].fingerprint(), Phase.PENDING, "key",
                              created_at=float(k)) for j in range(ns.models) for k in range(per)]
    t0 = time.perf_counter()
    out = decide.reconcile(specs, replicas, nodes, now=1000.0, remote=remote)
    took = time.perf_counter() - t0
    starts = [x for x in out if isinstance(x, d.StartShard)]
    print(f"index: placed {len(starts)} of {len(replicas)} pending replicas on {len(nodes)} nodes "
          f"in one pass: {took:.3f} s")

    everything = sorted(replicas, key=lambda r: (r.created_at, r.id))
    t0 = time.perf_counter()
    alone = fit.Placer(nodes.values(), fit.Ledger(replicas, specs), remote=remote)
    placed = sum(1 for r in everything if isinstance(alone.place(r.model, specs[r.model], replica_id=r.id), fit.Placed))
    print(f"placement alone (Ledger + Placer, no reconcile): {placed} placed in {time.perf_counter() - t0:.3f} s")

    if ns.remote:
        return
    order = everything[: ns.peer_replicas]
    peer = fit.Placer(nodes.values())
    t0 = time.perf_counter()
    chosen = [scan(peer, r.model, specs[r.model]) for r in order]
    peer_took = (time.perf_counter() - t0) * len(replicas) / max(len(order), 1)
    index = fit.Placer(nodes.values())
    same = sum(1 for r, c in zip(order, chosen, strict=True)
               if getattr(index.place(r.model, specs[r.model]), "node_id", None) == c)
    print(f"peer (scan every node), scaled to {len(replicas)} replicas: {peer_took:.1f} s; "
          f"index is {peer_took / took:.0f}x faster; first {len(order)} choices agree: {same}/{len(order)}")


if __name__ == "__main__":
    main()
