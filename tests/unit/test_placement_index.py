"""The placer's index decides exactly as a scan of every node would, on random clusters."""

from __future__ import annotations

import random

import pytest
from test_placement_data import gpu, node, rep, spec

from llmgw.control.placement import filters, fit
from llmgw.control.state import NodeView, Phase
from llmgw.core.inventory import WeightFile
from llmgw.core.specs import ModelSpec

PATHS = ("/m/a.gguf", "/m/b.gguf")


def scan(placer: fit.Placer, model: str, s: ModelSpec) -> fit.Placed | None:
    """The reference: every node checked, the best key by the documented order kept."""
    need = placer.need(model, s)
    held = placer.replicas_of(model)
    best = None
    for st in placer.states:
        if filters.static_reason(need, st.view) is not None or (free := filters.fits(need, st)) is None:
            continue
        no_weights = not any(w.path == need.weights_path for w in st.view.inventory.weights)
        k1, k2 = (st.unheld_gpus, st.free_memory) if need.gpu_count else (st.free_memory, st.free_threads)
        if need.policy == "binpack":
            key: tuple[int, ...] = (no_weights, k1, k2, st.idx)
        else:
            key = (held.get(st.idx, 0), no_weights, -k1, -k2, st.idx)
        if best is None or key < best[0]:
            best = (key, st, free)
    return None if best is None else placer.take(best[1], need, best[2])


def cluster(rng: random.Random) -> list[NodeView]:
    out = []
    for i in range(rng.randint(1, 14)):
        gs = tuple(gpu(g, used_gib=rng.choice((0, 0, 30, 75)), cc=rng.choice(("9.0", "8.0", "7.5", "")),
                       peers=tuple(p for p in range(4) if p != g and rng.random() < 0.5))
                   for g in range(rng.choice((0, 0, 2, 4))))
        weights = tuple(WeightFile(p, 1, "gguf") for p in PATHS if rng.random() < 0.3)
        out.append(node(f"n{i:02d}", free_gib=rng.choice((2, 4, 8, 8, 16)), cpus=rng.choice((4, 8)), gpus=gs,
                        weights=weights, cordoned=rng.random() < 0.1, connected=rng.random() < 0.95,
                        labels={"pool": "p1"} if rng.random() < 0.5 else {}))
    return out


def models(rng: random.Random) -> dict[str, ModelSpec]:
    out = {}
    for j in range(rng.randint(1, 5)):
        gpus = rng.choice((0, 0, 1, 2))
        out[f"m{j}"] = spec(memory_gib=rng.choice((0, 1, 3)), threads=rng.choice((0, 1, 2)), gpus=gpus,
                            gpu_gib=rng.choice((0, 10, 40)) if gpus else 0, cc=rng.choice(("", "8.0")) if gpus else "",
                            placement=rng.choice(("spread", "binpack")), pool=rng.choice(("", "", "p1")),
                            source="file://" + rng.choice(PATHS) if rng.random() < 0.6 else "")
    return out


@pytest.mark.parametrize("seed", range(300))
def test_index_agrees_with_a_full_scan(seed: int) -> None:
    """Thirty placements in a row: same node and same GPUs as the scan, every time."""
    rng = random.Random(seed)
    nodes, specs = cluster(rng), models(rng)
    placed = [rep(f"old{i}", n.id, rng.choice((Phase.READY, Phase.STARTING)), rng.choice(list(specs)))
              for i, n in enumerate(nodes) if rng.random() < 0.3]
    ledger_a, ledger_b = fit.Ledger(placed, specs), fit.Ledger(placed, specs)
    index, reference = fit.Placer(nodes, ledger_a, estimate=None), fit.Placer(nodes, ledger_b, estimate=None)
    for _ in range(30):
        model = rng.choice(list(specs))
        got = index.place(model, specs[model])
        want = scan(reference, model, specs[model])
        if want is None:
            assert isinstance(got, fit.Refused), (model, got)
        else:
            assert got == want, model
