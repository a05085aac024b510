"""Small fake Hugging Face repos written straight into a mirror's directory, for tests and benches.

``write_repo(dir, "org/name", files)`` lays the files out as ``llmgw mirror --dir dir`` serves them (see
``llmgw/mirror/store.py``) and returns the commit sha that ``main`` (or ``branch``) resolves to. The sha is
derived from the files' contents, so the same files give the same sha. ``sample_files()`` is a repo an
engine would want: config, tokenizer and two safetensors shards of random bytes (no valid header: nothing
here parses them).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path


def write_repo(root: Path | str, repo: str, files: dict[str, bytes], *, branch: str = "main") -> str:
    """Writes ``files`` as a commit of ``repo`` under ``root/hf`` with ``refs/<branch>`` naming it; returns the sha."""
    digest = hashlib.sha1(repo.encode(), usedforsecurity=False)
    for path in sorted(files):
        digest.update(f"\0{path}\0{hashlib.sha256(files[path]).hexdigest()}".encode())
    sha = digest.hexdigest()
    top = Path(root) / "hf" / repo
    for path, data in files.items():
        target = top / sha / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (top / "refs").mkdir(parents=True, exist_ok=True)
    (top / "refs" / branch).write_text(sha + "\n")
    return sha


def write_files(root: Path | str, name: str, files: dict[str, bytes]) -> Path:
    """Writes ``files`` as ``mirror://name/<path>`` content; returns the name's directory."""
    top = Path(root) / "files" / name
    for path, data in files.items():
        target = top / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return top


def sample_files(*, seed: int = 0, shard_bytes: int = 256 << 10, shards: int = 2) -> dict[str, bytes]:
    """A small model repo: config.json, tokenizer files and ``shards`` .safetensors of random bytes."""
    rng = random.Random(seed)
    files = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                   "num_hidden_layers": 2, "vocab_size": 256, "seed": seed}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 2048}',
    }
    for i in range(shards):
        files[f"model-{i + 1:05d}-of-{shards:05d}.safetensors"] = rng.randbytes(shard_bytes)
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": shard_bytes * shards},
         "weight_map": {f"layer{i}.weight": f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
                        for i in range(shards)}}).encode()
    return files
