"""Memory estimates from weights metadata, with figures worked by hand in the comments."""

from __future__ import annotations

import dataclasses

import pytest

from llmgw.core import estimate
from llmgw.core.inventory import WeightFile

MiB = 1 << 20
#: SmolLM2-135M-Instruct Q4_1 as the agent reads it (tests/unit/test_discovery_files.py checks the reading).
SMOL = WeightFile("/m/smol.gguf", 98_362_432, "gguf", params=134_515_008, layers=30, heads=9, kv_heads=3,
                  head_dim=64, hidden_size=576, context_length=8192)
#: Llama-3-70B-shaped, in bfloat16 safetensors: 80 layers, 8 KV heads of 128.
LLAMA70 = WeightFile("/m/llama70", 141_107_412_992, "safetensors", params=70_553_706_496, layers=80, heads=64,
                     kv_heads=8, head_dim=128, hidden_size=8192, context_length=8192, dtype_bytes=2)


def test_smollm2_by_hand() -> None:
    """weights 98,362,432 + KV 2x30x3x64x2 B x 4096 = 94,371,840; +10% rounded up; +128 MiB."""
    assert estimate.kv_bytes_per_token(SMOL) == 23_040
    body = 98_362_432 + 94_371_840  # 192,734,272
    assert estimate.memory_bytes(SMOL, 4096) == body + 19_273_428 + 128 * MiB == 346_225_428


def test_context_zero_is_the_models_own_and_parallel_multiplies_the_cache() -> None:
    """ctx 0 reads 8192 from the file; two sequences of 4096 hold as much KV as one of 8192."""
    assert estimate.memory_bytes(SMOL, 0) == estimate.memory_bytes(SMOL, 8192)
    assert estimate.memory_bytes(SMOL, 4096, parallel=2) == estimate.memory_bytes(SMOL, 8192)
    assert estimate.memory_bytes(SMOL, 8192) > estimate.memory_bytes(SMOL, 4096)  # type: ignore[operator]


def test_kv_bytes_follow_the_format_unless_given() -> None:
    """f16 (2) for GGUF, the model's dtype for safetensors (float32: 4), or what the caller says (q8_0: 1)."""
    f32 = dataclasses.replace(LLAMA70, dtype_bytes=4)
    assert estimate.kv_bytes_per_token(LLAMA70) == 2 * 80 * 8 * 128 * 2 == 327_680  # Llama-3-70B's 320 KiB
    assert estimate.kv_bytes_per_token(f32) == 655_360
    assert estimate.kv_bytes_per_token(LLAMA70, kv_bytes=1) == 163_840
    assert estimate.kv_bytes_per_token(dataclasses.replace(SMOL, dtype_bytes=4)) == 23_040  # GGUF: f16 cache


def test_tensor_parallel_splits_weights_and_kv_heads_but_not_the_fixed_part() -> None:
    """Per rank: 1/tp of the weights and at least one KV head; the overhead and a CUDA context each rank pays."""
    per_token_tp4 = 2 * 80 * 2 * 128 * 2  # 8 KV heads over 4 ranks: 2 each
    body = 141_107_412_992 // 4 + per_token_tp4 * 8192
    assert estimate.memory_bytes(LLAMA70, 8192, tensor_parallel=4, gpu=True) == (
        body + -(-body // 10) + 128 * MiB + 512 * MiB)
    # 3 KV heads over 2 ranks: 2 on one of them, and the estimate is for the fuller rank.
    assert estimate.kv_bytes_per_token(SMOL, tensor_parallel=2) == 2 * 30 * 2 * 64 * 2
    # More ranks than KV heads: each keeps one (vLLM replicates them).
    assert estimate.kv_bytes_per_token(SMOL, tensor_parallel=8) == 2 * 30 * 1 * 64 * 2


def test_a_gpu_adds_a_cuda_context() -> None:
    """The same model on a GPU is 512 MiB more than in CPU memory."""
    assert estimate.memory_bytes(SMOL, 4096, gpu=True) == estimate.memory_bytes(SMOL, 4096) + 512 * MiB  # type: ignore[operator]


def test_weights_size_falls_back_to_params_times_dtype() -> None:
    """No size on record: 1e9 params of bfloat16 are 2e9 bytes; neither known gives None."""
    w = WeightFile("/m/x", 0, "safetensors", params=1_000_000_000, dtype_bytes=2, layers=1, kv_heads=1, head_dim=1)
    assert estimate.weights_bytes(w) == 2_000_000_000
    assert estimate.weights_bytes(dataclasses.replace(w, dtype_bytes=0)) is None


@pytest.mark.parametrize("missing", [
    {"layers": 0}, {"kv_heads": 0}, {"head_dim": 0}, {"size_bytes": 0, "params": 0}, {"context_length": 0},
])
def test_not_enough_metadata_is_none(missing: dict[str, int]) -> None:
    """Any of layers, KV heads, head size, weights size, or (with ctx 0) the context missing: no estimate."""
    assert estimate.memory_bytes(dataclasses.replace(SMOL, **missing), 0) is None
    if "context_length" in missing:
        assert estimate.memory_bytes(dataclasses.replace(SMOL, **missing), 4096) == 346_225_428


def test_an_older_agents_weight_file_has_no_estimate() -> None:
    """A WeightFile without metadata (an agent before the fields) is None, not a guess."""
    assert estimate.memory_bytes(WeightFile("/m/a.gguf", 1 << 30, "gguf"), 4096) is None


@pytest.mark.parametrize("kw", [{"parallel": 0}, {"tensor_parallel": 0}, {"kv_bytes": 0}, {"ctx_tokens": -1}])
def test_nonsense_arguments_are_refused(kw: dict[str, int]) -> None:
    """A caller's mistake is a ValueError naming the arguments, not a silent zero."""
    args = {"ctx_tokens": 4096, **kw}
    with pytest.raises(ValueError, match="at least"):
        estimate.memory_bytes(SMOL, **args)
