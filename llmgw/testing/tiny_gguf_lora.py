"""A tiny, seeded GGUF LoRA adapter for a llama-architecture GGUF model (SmolLM2-135M in the tests), for llama.cpp.

Written as llama.cpp's ``convert_lora_to_gguf.py`` writes one (ggml-org/llama.cpp): ``general.type``
"adapter", ``adapter.type`` "lora", ``adapter.lora.alpha``, the base's ``general.architecture``, and per
adapted weight ``W`` (ggml shape ``[n_in, n_out]``) the tensors ``W.lora_a`` (ggml ``[n_in, rank]``) and
``W.lora_b`` (ggml ``[rank, n_out]``), which llama.cpp checks against the model's (``llama-adapter.cpp``).
Here only each layer's ``attn_q.weight`` is adapted, with random values large enough to change a greedy
answer; the same seed writes the same file.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_lora_gguf(path: Path, base: Path, *, seed: int, rank: int = 4, alpha: float = 8.0) -> Path:
    reader = gguf.GGUFReader(str(base))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}  # ggml order: (n_in, n_out)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    rng = np.random.default_rng(seed)
    for name in sorted((n for n in shapes if n.endswith(".attn_q.weight")), key=lambda n: int(n.split(".")[1])):
        n_in, n_out = shapes[name]
        # numpy's shape is ggml's reversed: lora_a [rank, n_in] is ggml [n_in, rank].
        writer.add_tensor(f"{name}.lora_a", (rng.standard_normal((rank, n_in)) * 0.5).astype(np.float32))
        writer.add_tensor(f"{name}.lora_b", (rng.standard_normal((n_out, rank)) * 0.5).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
