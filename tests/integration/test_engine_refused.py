"""A profile the engine would refuse is refused by the real control plane, with the reason, and nothing starts.

One server and one real agent. The agent's GPUs come from a captured
``nvidia-smi -q -x`` (two H100s) behind its injectable nvidia-smi path, and its
weights directory holds a safetensors model directory whose config.json says
32 attention heads: what the agent reports of it (over gRPC) is what
placement checks a vLLM model's tensor_parallel against.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System

pytestmark = pytest.mark.slow
NVIDIA_SMI_XML = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi-q-x-2gpu.xml"


def fake_nvidia_smi(path: Path) -> Path:
    """An executable that answers ``-q -x`` with the two-GPU fixture (a Python script: no shell)."""
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(NVIDIA_SMI_XML)!r}).read())\n")
    path.chmod(0o755)
    return path


def llama_dir(path: Path, *, heads: int = 32) -> Path:
    """A model directory as vLLM reads one: config.json and a (tiny) .safetensors file."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": 8, "hidden_size": 4096,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}}).encode()
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(32))
    return path


def vllm_model(name: str, source: Path, *, tp: int) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
            "spec": {"engine": "vllm", "source": f"file://{source}", "replicas": 1,
                     "resources": {"gpus": {"count": tp, "tensor_parallel": tp, "memory": "1GiB"}}}}


def engines_running(s: System, node_id: str, smi: Path) -> list[list[str]]:
    """The command lines of the agent's children, less its nvidia-smi (run every heartbeat, short-lived)."""
    out = []
    for pid in s.engine_pids(node_id):
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.NoSuchProcess:
            continue
        if str(smi) not in argv:
            out.append(argv)
    return out


def placed(s: System, name: str) -> dict[str, Any] | None:
    """The model's Placed condition once a pass has tried to place its replica, else None."""
    conds = {c["type"]: c for c in s.get(f"/api/v1/models/{name}/describe")["conditions"]}
    c = conds.get("Placed")
    return c if c and c["status"] == "False" and c["reason"] not in ("Waiting", "BackOff") else None


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused_and_never_started(tmp_path: Path) -> None:
    """32 heads at tensor_parallel 3: Placed False, EngineRefused, the sentence in get and describe; no engine."""
    smi = fake_nvidia_smi(tmp_path / "smi")
    s = System(tmp_path, agent_env={"LLMGW_AGENT_DISCOVERY__PREFER_NVML": "false",
                                    "LLMGW_AGENT_DISCOVERY__NVIDIA_SMI": str(smi)})
    try:
        llama = llama_dir(tmp_path / "node1" / "weights" / "llama")
        s.start_server()
        s.start_agent("node1")
        node = wait_for(lambda: next((n for n in s.get("/api/v1/nodes")["items"]
                                      if n["weights"] and n["gpus"]), None), timeout=30, what="weights and GPUs")
        assert isinstance(node, dict) and node["weights"][0]["heads"] == 32 and len(node["gpus"]) == 2

        # The spec alone is fine, so apply accepts it; the weights' metadata refuses it at placement.
        assert s.request("POST", "/api/v1/models", json=vllm_model("bad", llama, tp=3)).status_code == 201
        s.apply(vllm_model("good", llama, tp=2))
        cond = wait_for(lambda: placed(s, "bad"), timeout=30, interval=0.2, what="bad refused")
        assert isinstance(cond, dict) and cond["reason"] == "EngineRefused"
        sentence = "tensor_parallel 3 does not divide 32 attention heads; use 1, 2, 4, 8, 16 or 32"
        assert sentence in cond["message"]
        described = s.get("/api/v1/models/bad/describe")
        (rep,) = described["replicas"]
        assert rep["phase"] == "Pending" and rep["node"] is None and sentence in rep["message"]
        assert {c["type"]: c for c in rep["conditions"]}["Placed"]["reason"] == "EngineRefused"
        assert sentence in s.get("/api/v1/models/bad")["status"]["message"]
        # A profile the engine would run gets as far as the node filters (this node has no vLLM installed).
        good = wait_for(lambda: placed(s, "good"), timeout=30, interval=0.2, what="good tried")
        assert isinstance(good, dict) and good["reason"] == "Unschedulable" and "lacks engine vllm" in good["message"]

        env = {**s.cli_env(), "COLUMNS": "300"}
        shown = subprocess.run([*LLMGW, "describe", "model", "bad", "--url", s.url], capture_output=True,
                               text=True, timeout=60, env=env)
        assert shown.returncode == 0 and "EngineRefused" in shown.stdout and "does not divide 32" in shown.stdout
        listed = subprocess.run([*LLMGW, "get", "models", "--url", s.url], capture_output=True, text=True,
                                timeout=60, env=env)
        assert listed.returncode == 0 and "does not divide 32" in listed.stdout

        # Nothing was started for it: no shard on the node, no engine process under the agent.
        assert engines_running(s, "node1", smi) == []
        (n1,) = [n for n in s.get("/api/v1/nodes")["items"] if n["id"] == "node1"]
        assert n1["shard_states"] == []

        # What the model file alone proves is refused at apply, with the sentence and nothing stored.
        fp8 = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "fp8cpu"},
               "spec": {"engine": "vllm", "source": f"file://{llama}", "dtype": "fp8"}}
        r = s.request("POST", "/api/v1/models", json=fp8)
        assert r.status_code == 422 and r.json()["error"]["code"] == "engine_refused"
        assert "fp8 needs a GPU" in r.json()["error"]["message"]
        assert s.request("GET", "/api/v1/models/fp8cpu").status_code == 404
    finally:
        s.close()
