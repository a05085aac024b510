"""Refused before launch, with what to change: each check of ``enginecheck.problems`` on plain data."""

from __future__ import annotations

import dataclasses

import pytest

from llmgw.core import enginecheck, errors, inventory, shards

GIB = 1 << 30
#: A Llama-8B-like model: 32 heads, 8 KV heads of 128, 32 layers, 8k context, 16 GB of bf16 weights.
LLAMA = inventory.WeightFile(path="/models/llama", size_bytes=16 * GIB, format="safetensors", params=8_000_000_000,
                             layers=32, heads=32, kv_heads=8, head_dim=128, hidden_size=4096, context_length=8192,
                             dtype_bytes=2)
TINY = inventory.WeightFile(path="/models/tiny", size_bytes=2 << 20, format="safetensors", layers=2, heads=4,
                            kv_heads=4, head_dim=32, hidden_size=128, context_length=2048, dtype_bytes=4)
GPU = enginecheck.Profile(engine="vllm", gpus_per_node=2, tensor_parallel=2)


def gpu(index: int, *, total_gib: int = 80, used_gib: int = 0, cc: str = "9.0", name: str = "H100") -> inventory.Gpu:
    return inventory.Gpu(index=index, uuid=f"GPU-{index}", name=name, memory_total_bytes=total_gib * GIB,
                         memory_used_bytes=used_gib * GIB, compute_capability=cc)


def node(*gpus: inventory.Gpu, engines: tuple[tuple[str, str], ...] = (("vllm", "0.32.0"),),
         cpu_flags: tuple[str, ...] = ()) -> enginecheck.NodeFacts:
    return enginecheck.NodeFacts(gpus=gpus, engines=engines, cpu_flags=cpu_flags)


def one(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


def test_a_profile_that_fits_has_no_problem() -> None:
    """tp 2 on two H100s with room, a model whose heads divide, no flags clash: nothing is found."""
    assert enginecheck.problems(GPU, node(gpu(0), gpu(1)), LLAMA) == []
    enginecheck.validate(GPU, node(gpu(0), gpu(1)), LLAMA)


def test_an_engine_that_runs_on_one_node_is_refused_over_two() -> None:
    """llamacpp with nnodes 2 is refused, naming the engines that span nodes."""
    msg = one(enginecheck.problems(enginecheck.Profile(engine="llamacpp", nnodes=2)))
    assert msg.startswith("llamacpp runs a replica on one node only, not 2; set resources.nnodes to 1")
    assert "vllm" in msg and "sglang" in msg


def test_gpus_must_equal_tensor_times_pipeline_parallel() -> None:
    """2 GPUs per node on 2 nodes with tp 2 x pp 1 is refused with both products."""
    p = enginecheck.Profile(engine="vllm", gpus_per_node=2, nnodes=2, tensor_parallel=2, pipeline_parallel=1)
    assert one(enginecheck.problems(p)) == (
        "2 GPUs per node x 2 nodes is 4 GPUs, but tensor_parallel 2 x pipeline_parallel 1 is 2; make their "
        "product 4 or change the GPU count")
    assert enginecheck.problems(dataclasses.replace(p, pipeline_parallel=2)) == []


def test_attention_heads_must_divide_by_tensor_parallel() -> None:
    """tp 3 on 32 heads is refused, listing the sizes that divide them."""
    p = enginecheck.Profile(engine="vllm", gpus_per_node=3, tensor_parallel=3)
    found = enginecheck.problems(p, model=LLAMA)
    assert found[0] == "tensor_parallel 3 does not divide 32 attention heads; use 1, 2, 4, 8, 16 or 32"


@pytest.mark.parametrize(("tp", "heads", "kv", "refused"), [
    (16, 32, 8, False),  # tp > kv heads and a multiple: vLLM replicates each KV head twice
    (4, 32, 8, False),  # tp < kv heads and divides them: split
    (8, 32, 8, False),
    (4, 24, 6, True),  # neither 6 % 4 nor 4 % 6 is 0
])
def test_kv_heads_follow_vllms_split_or_replicate_rule(tp: int, heads: int, kv: int, refused: bool) -> None:
    """KV heads are refused only when tensor_parallel neither divides them nor is a multiple of them."""
    model = dataclasses.replace(LLAMA, heads=heads, kv_heads=kv)
    p = enginecheck.Profile(engine="vllm", gpus_per_node=tp, tensor_parallel=tp)
    found = [m for m in enginecheck.problems(p, model=model) if "KV heads" in m]
    if refused:
        assert found == [f"tensor_parallel {tp} neither divides the model's {kv} KV heads nor is a multiple of "
                         "them; use 1, 2, 3, 6, 12 or 24"]
    else:
        assert found == []


@pytest.mark.parametrize(("dtype", "cc", "need"), [("bfloat16", "7.5", "8.0"), ("fp8", "8.0", "8.9")])
def test_dtype_the_gpus_cannot_run_is_refused(dtype: str, cc: str, need: str) -> None:
    """bfloat16 needs compute capability 8.0 and fp8 8.9; the GPUs short of it are named."""
    p = dataclasses.replace(GPU, dtype=dtype)
    msg = one(enginecheck.problems(p, node(gpu(0, cc=cc, name="T4"), gpu(1, cc=cc, name="T4"))))
    assert msg == (f"dtype {dtype} needs compute capability {need} or later, and GPU 0 (T4, {cc}), GPU 1 (T4, {cc}) "
                   "have less; choose another dtype (float16 runs on every GPU) or GPUs that have it")
    assert enginecheck.problems(p, node(gpu(0, cc="9.0"), gpu(1, cc="9.0"))) == []


def test_a_gpu_that_does_not_report_its_capability_is_not_guessed() -> None:
    """No compute capability reported: the dtype check is skipped, not failed."""
    assert enginecheck.problems(dataclasses.replace(GPU, dtype="fp8"), node(gpu(0, cc=""), gpu(1, cc=""))) == []


def test_fp8_on_a_cpu_replica_is_refused() -> None:
    """fp8 without GPUs is refused whatever the node."""
    msg = one(enginecheck.problems(enginecheck.Profile(engine="vllm", dtype="fp8")))
    assert msg.startswith("dtype fp8 needs a GPU")


def test_only_the_given_gpus_are_judged() -> None:
    """Agent side, the GPUs the shard was given are checked, not an old one beside them."""
    p = dataclasses.replace(GPU, dtype="bfloat16", gpu_indices=(1, 2))
    facts = node(gpu(0, cc="7.0", name="V100"), gpu(1), gpu(2))
    assert enginecheck.problems(p, facts) == []
    assert "GPU 0 (V100, 7.0)" in one(enginecheck.problems(dataclasses.replace(p, gpu_indices=(0, 1)), facts))


def test_context_longer_than_the_model_is_refused() -> None:
    """context_length over max_position_embeddings is refused with the model's figure."""
    msg = one(enginecheck.problems(dataclasses.replace(GPU, context_length=32768), model=LLAMA))
    assert msg == ("context_length 32768 is longer than the model's 8192 (max_position_embeddings); lower "
                   "context_length to at most that")


def test_weights_and_kv_cache_above_the_free_gpu_memory_are_refused() -> None:
    """A 16 GB model at tp 1 on a 24 GB GPU with 12 GB used is refused; on an idle one it fits."""
    p = enginecheck.Profile(engine="vllm", gpus_per_node=1, tensor_parallel=1, gpu_indices=(0,))
    msg = one(enginecheck.problems(p, node(gpu(0, total_gib=24, used_gib=12)), LLAMA))
    assert msg.startswith("each GPU needs about ") and "KV cache of 8192 tokens at tensor_parallel 1" in msg
    assert msg.endswith("GPU 0 has 12.0 GiB free; raise tensor_parallel, lower context_length, or free the GPUs")
    assert enginecheck.problems(p, node(gpu(0, total_gib=24)), LLAMA) == []


def test_at_placement_the_freest_gpus_are_judged() -> None:
    """Without GPU indices the node's freest GPUs are taken: one busy GPU among idle ones is no refusal."""
    p = enginecheck.Profile(engine="vllm", gpus_per_node=1)
    assert enginecheck.problems(p, node(gpu(0, total_gib=24, used_gib=20), gpu(1, total_gib=24)), LLAMA) == []
    assert enginecheck.problems(p, node(gpu(0, total_gib=24, used_gib=20)), LLAMA) != []


def test_memory_is_not_checked_without_metadata() -> None:
    """A model without layers or KV heads, or GPUs without memory figures, skip the memory check."""
    p = enginecheck.Profile(engine="vllm", gpus_per_node=1, gpu_indices=(0,))
    bare = inventory.WeightFile(path="/m", size_bytes=100 * GIB, format="safetensors")
    assert enginecheck.problems(p, node(gpu(0, total_gib=24)), bare) == []
    assert enginecheck.problems(p, node(gpu(0, total_gib=0)), LLAMA) == []


def test_reserved_flags_in_engine_args_are_refused() -> None:
    """A flag llmgw sets (in any spelling vLLM takes: alias, =, underscores) is refused by name."""
    for arg in ("--port=9", "-tp", "--served_model_name"):
        msg = one(enginecheck.problems(dataclasses.replace(GPU, engine_args=(arg, "x"))))
        assert msg.startswith(f"engine args {arg} set flags llmgw sets itself for vllm (")
        assert msg.endswith("; remove them from engine_args")


def test_context_flag_given_again_is_refused() -> None:
    """context_length set and --max-model-len in engine args: keep one."""
    p = dataclasses.replace(GPU, context_length=4096, engine_args=("--max-model-len=2048",))
    assert one(enginecheck.problems(p)) == ("context_length 4096 is set and engine args set the context too "
                                            "(--max-model-len=2048); keep one, preferably context_length")
    assert enginecheck.problems(dataclasses.replace(p, context_length=0)) == []


def test_engine_version_the_node_lacks_is_refused() -> None:
    """engine_version 0.11 on a node with vLLM 0.32.0 is refused; 0.32 takes 0.32.0 (prefix on a dot)."""
    p = dataclasses.replace(GPU, engine_version="0.11")
    assert one(enginecheck.problems(p, node(gpu(0), gpu(1)))) == (
        "the node has vllm 0.32.0, not 0.11; install vllm 0.11 there or change engine_version")
    assert enginecheck.problems(dataclasses.replace(p, engine_version="0.32"), node(gpu(0), gpu(1))) == []
    assert enginecheck.problems(dataclasses.replace(p, engine_version="0.3"), node(gpu(0), gpu(1))) != []
    missing = one(enginecheck.problems(GPU, node(gpu(0), gpu(1), engines=(("sim", "1"),))))
    assert missing == "the node has no vllm installed (it has sim); install it there or choose another engine"


def test_small_heads_on_a_cpu_vllm_replica_are_refused() -> None:
    """vLLM's CPU attention needs head_dim >= 32: 16 is refused on CPU, fine on a GPU and for llama.cpp."""
    small = dataclasses.replace(TINY, head_dim=16)
    cpu = enginecheck.Profile(engine="vllm")
    assert one(enginecheck.problems(cpu, model=small)) == (
        "vllm on a CPU needs attention heads of at least 32 elements, and this model's have 16; give the "
        "replica a GPU or serve it with llamacpp")
    assert enginecheck.problems(cpu, model=TINY) == []
    assert enginecheck.problems(enginecheck.Profile(engine="llamacpp"), model=small) == []


def test_sglang_on_a_cpu_without_avx512_or_amx_is_refused() -> None:
    """An AVX2-only node cannot run SGLang's CPU kernels; an unknown CPU is not guessed."""
    p = enginecheck.Profile(engine="sglang")
    facts = node(engines=(("sglang", "0.5.23"),), cpu_flags=("avx", "avx2", "fma"))
    assert "needs one of the CPU features amx_bf16, avx512f" in one(enginecheck.problems(p, facts))
    assert enginecheck.problems(p, dataclasses.replace(facts, cpu_flags=("avx2", "avx512f"))) == []
    assert enginecheck.problems(p, dataclasses.replace(facts, cpu_flags=())) == []


def test_every_problem_is_reported_and_validate_raises_them_all() -> None:
    """Several problems come back together, and validate's EngineError names each."""
    p = enginecheck.Profile(engine="vllm", gpus_per_node=3, tensor_parallel=3, context_length=99999,
                            engine_args=("--port", "1"))
    found = enginecheck.problems(p, model=LLAMA)
    assert len(found) == 4  # reserved flag, heads, KV heads, context
    with pytest.raises(errors.EngineError) as e:
        enginecheck.validate(p, model=LLAMA)
    assert all(m in str(e.value) for m in found)


def test_a_profile_from_a_shard_carries_its_settings() -> None:
    """Profile.of_shard takes GPUs, parallel sizes, dtype, context and args from the shard spec."""
    spec = shards.ShardSpec(shard_id="s", replica_id="r", model="m", engine="vllm", served_name="m", gpus=(2, 3),
                            nnodes=2, tensor_parallel=2, pipeline_parallel=2, dtype="fp8", context_length=4096,
                            args=("--seed", "1"), gpu_memory_bytes=GIB)
    p = enginecheck.Profile.of_shard(spec, engine_version="0.32")
    assert (p.gpus_per_node, p.gpu_indices, p.nnodes, p.tensor_parallel, p.pipeline_parallel) == (2, (2, 3), 2, 2, 2)
    assert (p.dtype, p.context_length, p.engine_args, p.engine_version) == ("fp8", 4096, ("--seed", "1"), "0.32")
