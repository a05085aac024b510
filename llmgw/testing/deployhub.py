"""A local hub for the deploy preview's tests: a real ``llmgw mirror`` serving a GGUF repository (the tiny llama)
and a safetensors one (a Llama-shaped config.json and a real safetensors header), never the internet."""

from __future__ import annotations

import contextlib
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from llmgw.testing import hfrepo, procs, tiny_gguf

GGUF_REPO, GGUF_FILE = "test-org/tiny-llama-gguf", "tiny-llama-f32.gguf"
ST_REPO = "test-org/smol-llama"
#: SmolLM2-135M's config.json, as its repository has it.
ST_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "max_position_embeddings": 8192,
             "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
             "torch_dtype": "bfloat16", "vocab_size": 49152}


def safetensors_file(tensors: dict[str, np.ndarray]) -> bytes:
    """A .safetensors file as the format lays it out: length, JSON header, then each tensor's bytes."""
    header, data, offset = {}, b"", 0
    names = {np.dtype("float16"): "F16", np.dtype("float32"): "F32"}
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def write(root: Path, work: Path) -> None:
    """Both repositories under ``root`` (a mirror's --dir); ``work``: where the GGUF is written first."""
    gguf_path = tiny_gguf.write_tiny_llama_gguf(work / GGUF_FILE)
    hfrepo.write_repo(root, GGUF_REPO, {GGUF_FILE: gguf_path.read_bytes(), "README.md": b"# tiny\n"})
    st = safetensors_file({"model.embed_tokens.weight": np.zeros((512, 576), dtype=np.float16),
                           "model.norm.weight": np.ones((576,), dtype=np.float16)})
    hfrepo.write_repo(root, ST_REPO, {"config.json": json.dumps(ST_CONFIG).encode(), "model.safetensors": st,
                                      "tokenizer.json": b'{"version": "1.0"}'})


@contextlib.contextmanager
def running(work: Path) -> Iterator[str]:
    """A mirror serving both repositories on a free loopback port; its URL. Stopped by its pid whatever happens."""
    root = work / "hub"
    write(root, work)
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    with procs.Proc.start(argv, log_path=work / "hub.log") as proc:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/healthz", timeout=30)
        yield url
