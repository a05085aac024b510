"""GPU placement: free by the ledger and by the node's report, NVLink first, never double-booked."""

from __future__ import annotations

import dataclasses

from test_placement_data import GIB, gpu, node, rep, spec

from llmgw.control.placement import fit
from llmgw.control.placement import gpus as gpus_mod
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Phase
from llmgw.core.inventory import GpuProcess
from llmgw.core.shards import ShardState, ShardStatus


def eight(**kw: object) -> tuple:  # type: ignore[type-arg]
    return tuple(gpu(i, peers=tuple(p for p in range(8) if p != i), **kw) for i in range(8))  # type: ignore[arg-type]


def test_refusal_reads_like_the_issue() -> None:
    """"no node has 2 free GPUs with >= 40 GiB; node05 has 1 (GPU 3 has 75 GiB used); node07 lacks ..."."""
    s = spec(engine="llamacpp", version="0.11", gpus=2, gpu_gib=40)
    nodes = [node("node05", versions={"llamacpp": "0.11.1"}, gpus=(gpu(2), gpu(3, used_gib=75))),
             node("node07", versions={"llamacpp": "0.10.2"}, gpus=(gpu(0), gpu(1)))]
    out = fit.place("m", s, nodes)
    assert isinstance(out, fit.Refused)
    assert out.message == ("no node can run a replica of m: no node has 2 free GPUs with >= 40.0 GiB; "
                           "node05 has 1 (GPU 3 has 75.0 GiB used); node07 lacks llamacpp 0.11 (has 0.10.2)")
    assert out.reasons["node05"] == ("has 1 of the 2 free GPUs with >= 40.0 GiB needed "
                                     "(GPU 3 has 75.0 GiB used)")


def test_refusal_names_the_process_that_fills_a_gpu() -> None:
    """With the agent's process list: "node05 has 1 (GPU 3 used by pid 1234 (python3, 75.0 GiB))"."""
    s = spec(engine="llamacpp", version="0.11", gpus=2, gpu_gib=40)
    busy = dataclasses.replace(gpu(3, used_gib=75), processes=(GpuProcess(1234, 75 * GIB, "python3"),))
    nodes = [node("node05", versions={"llamacpp": "0.11.1"}, gpus=(gpu(2), busy)),
             node("node07", versions={"llamacpp": "0.10.2"}, gpus=(gpu(0), gpu(1)))]
    out = fit.place("m", s, nodes)
    assert isinstance(out, fit.Refused)
    assert out.message == ("no node can run a replica of m: no node has 2 free GPUs with >= 40.0 GiB; "
                           "node05 has 1 (GPU 3 used by pid 1234 (python3, 75.0 GiB)); "
                           "node07 lacks llamacpp 0.11 (has 0.10.2)")


def test_llmgw_shards_are_not_named_as_someone_else() -> None:
    """The node's own shard pids are left out; the rest are named largest first, two at most."""
    s = spec(gpus=1, gpu_gib=40)
    procs = (GpuProcess(100, 30 * GIB, "vllm"), GpuProcess(7, 1 * GIB), GpuProcess(8, 0, "Xorg"),
             GpuProcess(9, 20 * GIB, "python3"))
    n = node("a", gpus=(dataclasses.replace(gpu(0, used_gib=51), processes=procs),
                        dataclasses.replace(gpu(1, used_gib=60), processes=procs[:1])))
    n.shards["r9-1"] = ShardStatus("r9-1", "r9", ShardState.STOPPING, pid=100)
    out = fit.place("m", s, [n])
    assert isinstance(out, fit.Refused)
    # GPU 1 holds only the stopping llmgw shard: no one else to blame, so the figure is given.
    assert out.reasons["a"] == ("has 0 of the 1 free GPU with >= 40.0 GiB needed (GPU 0 used by "
                                "pid 9 (python3, 20.0 GiB), pid 7 (1.0 GiB) and 1 more; GPU 1 has 60.0 GiB used)")


def test_memory_used_by_another_process_counts() -> None:
    """A GPU llmgw never placed on, filled by someone else, is not free; its neighbour is."""
    s = spec(gpus=1, gpu_gib=40)
    out = fit.place("m", s, [node("a", gpus=(gpu(0, used_gib=60), gpu(1, used_gib=10)))])
    assert out == fit.Placed("a", (1,), 40 * GIB, False)


def test_without_stated_memory_a_gpu_must_be_nearly_idle() -> None:
    """No GPU memory and no weights to estimate from: only a GPU with 90% free qualifies."""
    s = spec(gpus=1)
    out = fit.place("m", s, [node("a", gpus=(gpu(0, used_gib=20), gpu(1, used_gib=4)))])
    assert isinstance(out, fit.Placed) and out.gpus == (1,)


def test_compute_capability_is_a_minimum_and_unknown_does_not_qualify() -> None:
    """8.0 takes 9.0 and 8.0, not 7.5 nor a GPU that does not say (nvidia-smi fallback)."""
    s = spec(gpus=1, cc="8.0")
    nodes = [node("a", gpus=(gpu(0, cc="7.5"), gpu(1, cc=""))), node("b", gpus=(gpu(0, cc="8.0"),))]
    assert fit.place("m", s, nodes) == fit.Placed("b", (0,), 0, False)
    out = fit.place("m", s, nodes[:1])
    assert isinstance(out, fit.Refused)
    assert out.reasons["a"] == ("has 0 of the 1 free GPU with compute capability >= 8.0 needed (GPU 0 has "
                                "compute capability 7.5; GPU 1 does not report its compute capability)")


def test_nvlink_set_is_preferred() -> None:
    """Two GPUs for tensor parallel: the linked pair, not the two lowest indices."""
    gs = (gpu(0), gpu(1), gpu(2, peers=(3,)), gpu(3))  # the link is reported by one end only
    assert gpus_mod.choose(gs, 2) == (2, 3)
    out = fit.place("m", spec(gpus=2, tp=2), [node("a", gpus=gs)])
    assert isinstance(out, fit.Placed) and out.gpus == (2, 3)


def test_then_one_pcie_switch_then_any() -> None:
    """Without NVLink, GPUs under one switch (same upper bus digit) come before the lowest indices."""
    gs = (gpu(0, bus="00000000:07:00.0"), gpu(1, bus="00000000:47:00.0"), gpu(2, bus="00000000:4E:00.0"))
    assert gpus_mod.choose(gs, 2) == (1, 2)
    assert gpus_mod.choose((gpu(5), gpu(1), gpu(3)), 2) == (1, 3)


def test_a_pass_never_gives_one_gpu_twice() -> None:
    """Four replicas of two GPUs fill an eight-GPU node with disjoint sets; the fifth is refused."""
    s = spec(gpus=2, gpu_gib=10, replicas=5)
    pending = [rep(f"r{i}", None, Phase.PENDING, created_at=i, of=s) for i in range(5)]
    out = decide.reconcile({"m": s}, pending, {"a": node("a", gpus=eight())}, now=0.0)
    starts = [c for c in out if isinstance(c, d.StartShard)]
    given = [c.spec.gpus for c in starts]
    assert len(given) == 4 and sorted(i for g in given for i in g) == list(range(8))
    five = next(c.record for c in out if isinstance(c, d.UpdateReplica) and c.record.id == "r4")
    assert five.phase is Phase.PENDING and "no node has 2 free GPUs with >= 10.0 GiB" in five.message
    assert "GPU 0 is given to replica r0" in five.message


def test_gpus_held_by_earlier_replicas_stay_held() -> None:
    """Across passes the ledger reads each placed replica's GPUs, Ready ones too, before the report shows them."""
    s = spec(gpus=2, gpu_gib=10)
    held = [rep("r1", "a", Phase.READY, gpus=(0, 1)), rep("r2", "a", Phase.STARTING, gpus=(2, 3))]
    out = fit.place("m", s, [node("a", gpus=eight())], fit.Ledger(held, {"m": s}))
    assert isinstance(out, fit.Placed) and out.gpus == (4, 5)
    # A replica whose model was deleted but whose engine is still stopping holds its GPUs too.
    out = fit.place("m", s, [node("a", gpus=eight()[:2])],
                    fit.Ledger([rep("x", "a", Phase.TERMINATING, "gone", gpus=(0,))], {"m": s}))
    assert isinstance(out, fit.Refused) and "GPU 0 is given to replica x" in out.message


def test_binpack_and_spread_over_gpu_nodes() -> None:
    """binpack takes the node with the fewest free GPUs that suffice; spread the most."""
    nodes = [node("a", gpus=eight()), node("b", gpus=eight()[:2]), node("c", gpus=eight()[:1])]
    assert fit.place("m", spec(gpus=2, placement="binpack"), nodes).node_id == "b"  # type: ignore[union-attr]
    assert fit.place("m", spec(gpus=2, placement="spread"), nodes).node_id == "a"  # type: ignore[union-attr]


def test_shard_spec_carries_the_gpus() -> None:
    """The StartShard for a GPU replica names its GPU indices, for CUDA_VISIBLE_DEVICES on the agent."""
    s = spec(gpus=1, gpu_gib=10)
    out = decide.reconcile({"m": s}, [rep("r0", None, Phase.PENDING, of=s)],
                           {"a": node("a", gpus=(gpu(0, used_gib=75), gpu(1)))}, now=0.0)
    start = next(c for c in out if isinstance(c, d.StartShard))
    assert start.spec.gpus == (1,)
    update = next(c.record for c in out if isinstance(c, d.UpdateReplica))
    assert update.gpus == (1,) and update.message == "starting on node a (GPU 1)"


def test_the_fast_check_agrees_with_the_reasons() -> None:
    """usable() (the hot path) takes exactly the GPUs why_unusable() has nothing against."""
    from llmgw.control.placement.needs import need_for

    gs = [gpu(i, used_gib=u, cc=cc) for i, (u, cc) in enumerate(
        [(0, "9.0"), (30, "9.0"), (75, "8.0"), (0, ""), (0, "7.5"), (9, "8.6"), (0, "8.0")])]
    held = {6: "r1"}
    for s in (spec(gpus=1), spec(gpus=1, gpu_gib=40), spec(gpus=1, cc="8.0"), spec(gpus=1, gpu_gib=10, cc="9.0")):
        need = need_for("m", s)
        assert gpus_mod.usable(gs, held, need) == [g for g in gs if gpus_mod.why_unusable(g, held, need) is None]
