"""A prompt's prefix-cache block hashes, computed exactly as vLLM computes them (pure: standard library).

What vLLM does (read in vLLM 0.32's installed source, ``vllm/v1/core/kv_cache_utils.py`` and
``vllm/utils/hashing.py``; upstream: https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_utils.py):

* A prompt's token ids are cut into full blocks of ``block_size`` tokens (``--block-size``; a partial
  last block is never hashed). Block ``i``'s hash is
  ``hash_fn((parent, tuple(block_i_token_ids), extra_keys))`` where ``parent`` is block ``i-1``'s
  hash, or ``NONE_HASH`` for the first block (``hash_block_tokens``). The chain makes each hash
  fingerprint the whole prefix ending at its block.
* ``hash_fn`` is ``--prefix-caching-hash-algo``: ``sha256`` (the default: SHA-256 of
  ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)``), ``sha256_cbor`` (SHA-256 of
  ``cbor2.dumps(obj, canonical=True)``: language-neutral), or ``xxhash``/``xxhash_cbor`` (not
  collision resistant, so vLLM seeds them randomly per process: not reproducible, refused here).
* ``NONE_HASH = hash_fn(seed)`` where ``seed`` is ``PYTHONHASHSEED`` when the engine's environment
  sets it, else the fixed string ``"vllm-none-hash"`` for the sha256 family (``init_none_hash``).
  So the router must know whether the engine was started with ``PYTHONHASHSEED`` (the agent sets
  the engine's environment, so it knows).
* ``extra_keys`` is None for a plain text prompt; LoRA adds ``("lora", name)``, a ``cache_salt``
  adds the salt string, multimodal inputs add ``("mm", identifier, offset)`` (``generate_block_hash_extra_keys``).
* The KV events carry the hashes as "external" hashes: with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``
  (the default) the low 64 bits of the digest read big-endian (``maybe_convert_block_hash``), else
  the 32 digest bytes.

``tests/fixtures/vllm_kv/hashes.json`` holds hashes computed by vLLM's own functions (its
``generate.py`` says how); ``tests/unit/test_kvhash.py`` holds this module to them.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Sequence
from typing import Any

#: The algorithms whose hashes another process can reproduce (``--prefix-caching-hash-algo``).
ALGORITHMS = ("sha256", "sha256_cbor")
#: vLLM's NONE_HASH seed when the engine's PYTHONHASHSEED is unset (``DEFAULT_NONE_HASH_SEED``).
DEFAULT_SEED = "vllm-none-hash"


def _cbor(obj: Any, out: bytearray) -> None:
    """Canonical CBOR (RFC 8949 4.2.1) of the types a block hash key holds, as ``cbor2.dumps(canonical=True)``."""
    if obj is None:
        out.append(0xF6)
    elif obj is True or obj is False:
        out.append(0xF5 if obj else 0xF4)
    elif isinstance(obj, int):
        if obj >= 0:
            _head(0, obj, out)
        else:
            _head(1, -1 - obj, out)
    elif isinstance(obj, (bytes, bytearray)):
        _head(2, len(obj), out)
        out += obj
    elif isinstance(obj, str):
        raw = obj.encode("utf-8")
        _head(3, len(raw), out)
        out += raw
    elif isinstance(obj, (tuple, list)):
        _head(4, len(obj), out)
        for item in obj:
            _cbor(item, out)
    else:
        raise TypeError(f"cannot CBOR-encode a {type(obj).__name__} in a block hash key")


def _head(major: int, n: int, out: bytearray) -> None:
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += bytes((major << 5 | 24, n))
    elif n < 1 << 16:
        out += bytes((major << 5 | 25,)) + struct.pack(">H", n)
    elif n < 1 << 32:
        out += bytes((major << 5 | 26,)) + struct.pack(">I", n)
    elif n < 1 << 64:
        out += bytes((major << 5 | 27,)) + struct.pack(">Q", n)
    else:
        raise ValueError("integers past 64 bits are not in block hash keys")


def digest(algo: str, obj: Any) -> bytes:
    """``vllm.utils.hashing.sha256`` / ``sha256_cbor`` of ``obj``."""
    if algo == "sha256":
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if algo == "sha256_cbor":
        out = bytearray()
        _cbor(obj, out)
        return hashlib.sha256(out).digest()
    raise ValueError(f"prefix caching hash algorithm {algo!r} cannot be reproduced outside the engine; "
                     f"start vLLM with --prefix-caching-hash-algo set to one of {', '.join(ALGORITHMS)}")


def none_hash(algo: str = "sha256", pythonhashseed: str | None = None) -> bytes:
    """vLLM's NONE_HASH: the parent of every prompt's first block."""
    return digest(algo, DEFAULT_SEED if pythonhashseed is None else pythonhashseed)


def block_hashes(tokens: Sequence[int], block_size: int, *, algo: str = "sha256",
                 pythonhashseed: str | None = None, extra_keys: tuple[Any, ...] | None = None,
                 limit: int | None = None) -> list[bytes]:
    """The chained hash of each full block of ``tokens`` (at most ``limit`` blocks), as the engine computes it."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    parent = none_hash(algo, pythonhashseed)
    n = len(tokens) // block_size
    if limit is not None:
        n = min(n, limit)
    out: list[bytes] = []
    for i in range(n):
        parent = digest(algo, (parent, tuple(tokens[i * block_size:(i + 1) * block_size]), extra_keys))
        out.append(parent)
    return out


def external(block_hash: bytes, *, int_hashes: bool = True) -> int | bytes:
    """The hash as KV events carry it (``maybe_convert_block_hash``): its low 64 bits, or the digest."""
    if not int_hashes:
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
