"""Tiny random LoRA adapters for the tiny Llama of ``llmgw.testing.tiny_hf``, written on the fly, for real vLLM.

What vLLM 0.32 loads from a directory (``vllm/lora/peft_helper.py``, ``lora_model.py``): PEFT's
``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``) and ``adapter_model.safetensors`` whose
tensors are named as PEFT names them, ``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight``
(rank x in) and ``...lora_B.weight`` (out x rank). PEFT is not in vLLM's venv, so the files are written
directly. Unlike PEFT's initialisation (B = 0, which changes nothing), B is random too, and large enough
that greedy decoding through an adapter differs from the base's: the test needs each adapter to answer
differently, not sensibly. Seeded: the same bytes for the same seed.

Run with the venv that has torch (vLLM's), from the repository root::

    .venv-vllm/bin/python -m llmgw.testing.tiny_lora OUT_DIR SEED [RANK]

It imports nothing from llmgw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

#: As ``tiny_hf``: hidden size 128, 2 layers, 4 heads of 32 (q and v projections are 128 x 128).
HIDDEN = 128
LAYERS = 2
TARGETS = ("q_proj", "v_proj")


def write(out: Path, seed: int, rank: int = 8) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for target in TARGETS:
            key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, HIDDEN, generator=gen) * 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(HIDDEN, rank, generator=gen) * 0.5
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "target_modules": list(TARGETS),
              "modules_to_save": None, "base_model_name_or_path": "tiny-llama", "inference_mode": True}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    for path in (out, *out.iterdir()):  # the engine runs as a user of its own (README, Security): it must read them
        path.chmod(0o755 if path.is_dir() else 0o644)


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8)
