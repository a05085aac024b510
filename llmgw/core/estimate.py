"""How much memory an engine needs for a model, from what its weights say about it.

Used by placement when a model file states no memory: an estimate that is a
little high refuses a node that would have fitted, one that is low starts an
engine that dies of out-of-memory minutes into loading, so every assumption
below leans high. The formula::

    weights  = the weights' size on disk (a GGUF file, or the sum of a
               safetensors directory's files); params x dtype_bytes when the
               size is not known
    kv       = 2 (keys and values) x layers x kv_heads x head_dim
               x kv_bytes x ctx_tokens x parallel
    total    = (weights + kv) x (1 + OVERHEAD_PERCENT / 100), rounded up
               + OVERHEAD_BYTES (+ CUDA_CONTEXT_BYTES on a GPU)

Assumptions, and what they get wrong:

* The weights are held once, at their size on disk (llama.cpp maps the GGUF;
  vLLM loads safetensors in their stored dtype). A model quantized at load
  time, or offloaded in part, uses less.
* The KV cache is full-attention: every layer keeps keys and values for every
  token. Sliding-window layers (Gemma, Mistral) and multi-head latent attention
  (DeepSeek) keep less, so they are over-estimated. ``kv_bytes`` is 2 (f16,
  llama.cpp's default cache type) unless given; for a safetensors model it is
  the model's dtype, which is what vLLM's ``kv_cache_dtype=auto`` uses.
* ``ctx_tokens`` is the context of one sequence and ``parallel`` how many
  sequences are held at once. llama.cpp's unified KV cache (its default)
  shares ``--ctx-size`` among all slots: give that with ``parallel=1``
  (measured: SmolLM2-135M at ``--ctx-size 8192`` had the same RSS, 339 MiB,
  with 1 slot and with 4). ``ctx_tokens`` 0 means the model's training context.
* The overhead covers compute buffers, the engine's own code and allocator
  slack. Measured on the 2-core CI machine: the xllamacpp server with
  SmolLM2-135M-Instruct Q4_1 (93.8 MiB) used 204 MiB RSS at ctx 2048 and
  339 MiB at 8192, 65 MiB above weights + KV both times; this formula gives
  280 and 429 MiB. A CUDA context takes a few hundred MiB per GPU before
  anything is loaded, hence ``CUDA_CONTEXT_BYTES`` per rank.
* With tensor parallelism each rank holds 1/tp of the weights and of the KV
  heads (at least one: vLLM replicates KV heads when there are fewer than
  ranks), and pays the fixed overhead itself; the answer is per rank then.
"""

from __future__ import annotations

import math

from llmgw.core.inventory import WeightFile

#: Compute buffers and allocator slack, in percent of weights + KV cache.
OVERHEAD_PERCENT = 10
#: The engine process itself (interpreter, libraries, scratch): twice the 65 MiB measured.
OVERHEAD_BYTES = 128 << 20
#: A CUDA context and cuBLAS workspaces, per GPU rank.
CUDA_CONTEXT_BYTES = 512 << 20
#: f16, llama.cpp's default KV cache type.
DEFAULT_KV_BYTES = 2


def weights_bytes(weight: WeightFile) -> int | None:
    """The weights' size in memory: their size on disk, else params x dtype; None when neither is known."""
    if weight.size_bytes > 0:
        return weight.size_bytes
    if weight.params > 0 and weight.dtype_bytes > 0:
        return weight.params * weight.dtype_bytes
    return None


def kv_bytes_per_token(weight: WeightFile, *, kv_bytes: int | None = None, tensor_parallel: int = 1) -> int | None:
    """Bytes of KV cache one token of context takes (on one rank); None without layers, KV heads or head size."""
    if weight.layers <= 0 or weight.kv_heads <= 0 or weight.head_dim <= 0:
        return None
    per_rank_heads = max(1, math.ceil(weight.kv_heads / tensor_parallel))
    return 2 * weight.layers * per_rank_heads * weight.head_dim * _kv_bytes(weight, kv_bytes)


def _kv_bytes(weight: WeightFile, kv_bytes: int | None) -> int:
    if kv_bytes is not None:
        return kv_bytes
    if weight.format == "safetensors" and weight.dtype_bytes > 0:
        return weight.dtype_bytes
    return DEFAULT_KV_BYTES


def memory_bytes(weight: WeightFile, ctx_tokens: int, *, parallel: int = 1, tensor_parallel: int = 1,
                 kv_bytes: int | None = None, gpu: bool = False) -> int | None:
    """Bytes one engine (one rank of ``tensor_parallel``) needs; None when the metadata is not enough.

    See the module docstring for the formula and what it assumes. ``ctx_tokens``
    0 means the model's own context length; ``gpu`` adds a CUDA context.
    """
    if parallel < 1 or tensor_parallel < 1 or ctx_tokens < 0 or (kv_bytes is not None and kv_bytes < 1):
        raise ValueError(f"parallel ({parallel}) and tensor_parallel ({tensor_parallel}) must be at least 1, "
                         f"ctx_tokens ({ctx_tokens}) at least 0 and kv_bytes ({kv_bytes}) at least 1")
    weights = weights_bytes(weight)
    per_token = kv_bytes_per_token(weight, kv_bytes=kv_bytes, tensor_parallel=tensor_parallel)
    ctx = ctx_tokens or weight.context_length
    if weights is None or per_token is None or ctx <= 0:
        return None
    body = math.ceil(weights / tensor_parallel) + per_token * ctx * parallel
    fixed = OVERHEAD_BYTES + (CUDA_CONTEXT_BYTES if gpu else 0)
    # Whole numbers throughout: a float would round a 400 GB model's figure.
    return body + -(-body * OVERHEAD_PERCENT // 100) + fixed
