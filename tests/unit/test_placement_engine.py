"""Placement refuses what the engine would refuse: the model-level check once per model, the node-level as filters."""

from __future__ import annotations

import dataclasses

import pytest
from test_placement_data import GIB, gpu, hca, ib_fabric, node, rep, spec

from llmgw.control import conditions as cond
from llmgw.control.placement import explain, fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase
from llmgw.core import enginecheck
from llmgw.core.inventory import WeightFile
from llmgw.core.specs import ModelSpec

LLAMA = "/models/llama-8b"
#: config.json of a Llama-3-8B-like model: 32 attention heads, 8 KV heads, 8192 tokens.
META = WeightFile(LLAMA, 16 * GIB, "safetensors", params=8 * 10**9, layers=32, heads=32, kv_heads=8,
                  head_dim=128, hidden_size=4096, context_length=8192, dtype_bytes=2)


def vllm(*, gpus: int = 4, tp: int = 0, dtype: str = "", context: int = 0, gpu_gib: float = 40,
         nnodes: int = 1, source: str = f"file://{LLAMA}") -> ModelSpec:
    s = spec(engine="vllm", gpus=gpus, tp=tp, gpu_gib=gpu_gib, nnodes=nnodes, source=source)
    return dataclasses.replace(s, dtype=dtype, context_length=context)


def gpu_node(nid: str = "a", *, count: int = 8, cc: str = "9.0", weights: tuple[WeightFile, ...] = (META,),
             **kw: object) -> NodeView:
    return node(nid, engines=("vllm",), gpus=tuple(gpu(i, cc=cc) for i in range(count)), weights=weights,
                **kw)  # type: ignore[arg-type]


def place(s: ModelSpec, nodes: list[NodeView], model: str = "m") -> fit.Placed | fit.Refused:
    return fit.place(model, s, nodes, fit.Ledger((), {model: s}))


def test_bfloat16_on_turing_is_refused_with_the_capability_it_needs() -> None:
    """2 GPUs of compute capability 7.5 do not take a bfloat16 model; the sentence says bf16 needs 8.0."""
    s = vllm(gpus=2, dtype="bfloat16", gpu_gib=10)
    out = place(s, [gpu_node("t4", count=2, cc="7.5")])
    assert isinstance(out, fit.Refused) and out.reason == explain.UNSCHEDULABLE
    assert "bfloat16 needs compute capability 8.0" in out.message
    assert "use float16" in out.message
    assert "GPU 0 has compute capability 7.5" in out.reasons["t4"]
    # float16 runs there, and bfloat16 runs on an Ampere node.
    assert isinstance(place(dataclasses.replace(s, dtype="float16"), [gpu_node("t4", count=2, cc="7.5")]), fit.Placed)
    out = place(s, [gpu_node("t4", count=2, cc="7.5"), gpu_node("a100", count=2, cc="8.0")])
    assert isinstance(out, fit.Placed) and out.node_id == "a100" and out.gpus == (0, 1)


def test_a_stated_capability_above_the_dtypes_stays() -> None:
    """compute_capability 9.0 stated with bfloat16 keeps 9.0, and the sentence does not blame the dtype."""
    s = dataclasses.replace(spec(engine="vllm", gpus=2, gpu_gib=10, cc="9.0"), dtype="bfloat16")
    out = place(s, [gpu_node("a100", count=2, cc="8.0")])
    assert isinstance(out, fit.Refused) and "compute capability >= 9.0" in out.message
    assert "bfloat16 needs" not in out.message


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused_before_launch() -> None:
    """32 heads at tensor_parallel 3: EngineRefused, naming the sizes that divide them, whatever the node."""
    s = vllm(gpus=3, tp=3)
    out = place(s, [gpu_node("a"), gpu_node("b")])
    assert isinstance(out, fit.Refused) and out.reason == explain.ENGINE_REFUSED
    assert "tensor_parallel 3 does not divide 32 attention heads; use 1, 2, 4, 8, 16 or 32" in out.message
    assert explain.reason_of(out.message) == explain.ENGINE_REFUSED and out.reasons == {}


def test_a_good_profile_is_placed() -> None:
    """The same model at tensor_parallel 4 is placed on 4 GPUs of the node holding its weights."""
    out = place(vllm(gpus=4, tp=4), [gpu_node("empty", weights=()), gpu_node("has")])
    assert isinstance(out, fit.Placed) and out.node_id == "has" and out.gpus == (0, 1, 2, 3)


def test_context_longer_than_the_model_is_refused() -> None:
    """context_length above the model's max_position_embeddings is refused with the model's own figure."""
    out = place(vllm(gpus=4, context=32768), [gpu_node()])
    assert isinstance(out, fit.Refused) and out.reason == explain.ENGINE_REFUSED
    assert "context_length 32768 is longer than the model's 8192" in out.message


def test_checks_needing_metadata_are_skipped_when_no_node_reports_the_weights() -> None:
    """No node lists the weights: heads are unknown, so tensor_parallel 3 is not refused on a guess."""
    out = place(vllm(gpus=3, tp=3), [gpu_node(weights=())])
    assert isinstance(out, fit.Placed)
    unread = WeightFile(LLAMA, 16 * GIB, "safetensors")  # config.json could not be read
    assert isinstance(place(vllm(gpus=3, tp=3), [gpu_node(weights=(unread,))]), fit.Placed)


def test_the_engine_check_runs_once_per_model_and_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass of 50 pending replicas on 200 nodes asks the engine check once per model, not per node or replica."""
    calls: list[str] = []
    real = enginecheck.problems

    def counted(profile: enginecheck.Profile, node: object = None, model: object = None) -> list[str]:
        calls.append(profile.engine)
        return real(profile, node, model)  # type: ignore[arg-type]

    monkeypatch.setattr(enginecheck, "problems", counted)
    good, bad = vllm(gpus=1, tp=1, gpu_gib=1), vllm(gpus=3, tp=3)
    models = {"good": dataclasses.replace(good, replicas=25), "bad": dataclasses.replace(bad, replicas=25)}
    pending = [rep(f"{m}{i}", None, Phase.PENDING, m, created_at=i, of=models[m]) for m in models for i in range(25)]
    nodes = {f"n{i:03d}": gpu_node(f"n{i:03d}") for i in range(200)}
    out = decide.reconcile(models, pending, nodes, now=0.0)
    assert len(calls) == 2
    assert sum(1 for c in out if isinstance(c, d.StartShard)) == 25


def test_a_refused_replica_starts_nothing_and_its_conditions_say_engine_refused() -> None:
    """Through a reconcile pass: no StartShard, and Placed is False with reason EngineRefused on replica and model."""
    s = dataclasses.replace(vllm(gpus=3, tp=3), replicas=1)
    nodes = {"a": gpu_node("a")}
    r = rep("r1", None, Phase.PENDING, of=s)
    out = decide.reconcile({"m": s}, [r], nodes, now=0.0)
    assert not [c for c in out if isinstance(c, d.StartShard)]
    updated = next(c.record for c in out if isinstance(c, d.UpdateReplica))
    assert updated.phase is Phase.PENDING and "does not divide 32 attention heads" in updated.message
    rc = cond.replica_conditions(updated, s, nodes, now=0.0, crash_loop_after=3)
    placed = next(c for c in rc if c.type == "Placed")
    assert (placed.status, placed.reason) == (cond.FALSE, "EngineRefused")
    mc = cond.model_conditions(s, [updated], {updated.id: rc}, nodes)
    model_placed = next(c for c in mc if c.type == "Placed")
    assert model_placed.reason == "EngineRefused" and "use 1, 2, 4, 8, 16 or 32" in model_placed.message


def test_a_group_is_refused_before_any_node_is_taken() -> None:
    """A multi-node vLLM replica at tensor_parallel 6 over 2 nodes of 3 GPUs is refused, and nothing is held."""
    nodes = [gpu_node(n, count=4, fabrics=(ib_fabric("ib", "mlx5_0"),), hcas=(hca("mlx5_0"),)) for n in "ab"]
    placer = fit.Placer(nodes)
    out = fit.place_group(placer, "m", vllm(gpus=3, tp=6, nnodes=2), replica_id="r1")
    assert isinstance(out, fit.Refused) and out.reason == explain.ENGINE_REFUSED
    assert "tensor_parallel 6 does not divide 32 attention heads" in out.message
    assert all(not st.held for st in placer.states)
    ok = fit.place_group(placer, "m2", vllm(gpus=4, tp=8, nnodes=2), replica_id="r2")
    assert isinstance(ok, fit.Group) and [k.node_id for k in ok.ranks] == ["a", "b"]


def test_gpu_memory_the_weights_need_is_a_node_filter() -> None:
    """With no GPU memory stated, GPUs with less free than the weights' estimate do not qualify."""
    s = vllm(gpus=1, tp=1, gpu_gib=0)
    small = node("small", engines=("vllm",), gpus=(gpu(0, total_gib=16, used_gib=1),), weights=(META,))
    out = place(s, [small])
    assert isinstance(out, fit.Refused) and out.reason == explain.UNSCHEDULABLE
    assert "no node has 1 free GPU with >= " in out.message and "GPU 0 has 1.0 GiB used" in out.message
    big = node("big", engines=("vllm",), gpus=(gpu(0, total_gib=80),), weights=(META,))
    found = place(s, [small, big])
    assert isinstance(found, fit.Placed) and found.node_id == "big" and found.memory_estimated


def cpu_node(nid: str, *flags: str) -> NodeView:
    v = node(nid, engines=("sglang",), free_gib=32, gpus=(gpu(0),) if nid.startswith("gpu") else ())
    return dataclasses.replace(v, inventory=dataclasses.replace(
        v.inventory, host=dataclasses.replace(v.inventory.host, cpu_flags=flags)))


def test_an_engine_whose_cpu_kernels_need_avx512_skips_nodes_without_it() -> None:
    """SGLang on a CPU: an AVX2-only node is refused saying what the CPU lacks; one with AVX-512 takes it."""
    s = spec(engine="sglang", source="file:///models/x", memory_gib=1)
    out = place(s, [cpu_node("avx2", "sse4_2", "avx2")])
    assert isinstance(out, fit.Refused) and out.reason == explain.UNSCHEDULABLE
    assert "no node's CPU has amx_bf16 or avx512f, which sglang needs to run without a GPU" in out.message
    assert out.reasons == {"avx2": "has a CPU without amx_bf16 or avx512f"}
    found = place(s, [cpu_node("avx2", "avx2"), cpu_node("avx512", "avx2", "avx512f")])
    assert isinstance(found, fit.Placed) and found.node_id == "avx512"
    # A node that does not list its flags is not refused on a guess; a GPU replica does not need them.
    assert isinstance(place(s, [cpu_node("unknown")]), fit.Placed)
    gpu_model = spec(engine="sglang", source="file:///models/x", gpus=1, gpu_gib=1)
    assert isinstance(place(gpu_model, [cpu_node("gpu1", "avx2")]), fit.Placed)
