"""Placement: the filters, binpack and spread, weights first, and the sentence when no node fits."""

from __future__ import annotations

from test_placement_data import GIB, node, rep, spec

from llmgw.control.placement import fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Phase
from llmgw.core import engines
from llmgw.core.inventory import WeightFile


def place(s, nodes, replicas=(), model="m", **kw):  # type: ignore[no-untyped-def]
    return fit.place(model, s, nodes, fit.Ledger(replicas, {model: s}), **kw)


def refused(s, nodes, replicas=(), **kw) -> fit.Refused:  # type: ignore[no-untyped-def]
    out = place(s, nodes, replicas, **kw)
    assert isinstance(out, fit.Refused), out
    return out


def test_spreads_replicas_of_one_model() -> None:
    """A second replica goes to the node without one, even if the other has more memory."""
    out = place(spec(), [node("a", free_gib=32), node("b", free_gib=4)], [rep("r1", "a", Phase.READY)])
    assert isinstance(out, fit.Placed) and out.node_id == "b"


def test_spread_prefers_most_free_memory_then_id() -> None:
    """Ties on replica count go to the node with more free memory, then to the lower id."""
    assert place(spec(), [node("a", free_gib=2), node("b", free_gib=6)]).node_id == "b"  # type: ignore[union-attr]
    assert place(spec(), [node("b"), node("a"), node("c")]).node_id == "a"  # type: ignore[union-attr]


def test_binpack_takes_the_fullest_node_that_fits() -> None:
    """binpack: the node with the least free memory that still takes the replica."""
    s = spec(memory_gib=3, placement="binpack")
    nodes = [node("a", free_gib=16), node("b", free_gib=2), node("c", free_gib=4), node("d", free_gib=4)]
    assert place(s, nodes).node_id == "c"  # type: ignore[union-attr]


def test_binpack_fills_one_node_before_the_next() -> None:
    """A pass of binpacked replicas fills a node, then moves on; spread gives each node one."""
    nodes = {n: node(n, free_gib=10) for n in ("a", "b", "c")}
    for policy, want in (("binpack", ["a", "a", "a", "b"]), ("spread", ["a", "b", "c", "a"])):
        s = spec(memory_gib=3, placement=policy, replicas=4)
        pending = [rep(f"r{i}", None, Phase.PENDING, created_at=i, of=s) for i in range(4)]
        out = decide.reconcile({"m": s}, pending, nodes, now=0.0)
        starts = sorted((c for c in out if isinstance(c, d.StartShard)), key=lambda c: c.spec.replica_id)
        assert [c.node_id for c in starts] == want, policy


def test_loading_replicas_reserve_memory() -> None:
    """Memory of replicas still Starting on a node counts as taken; Ready ones are in the report already."""
    s = spec(memory_gib=3)
    out = refused(s, [node("a", free_gib=5)], [rep("r1", "a", Phase.STARTING)])
    assert out.reasons == {"a": "has 2.0 GiB free memory, needs 3.0 GiB"}
    assert place(s, [node("a", free_gib=5)], [rep("r1", "a", Phase.READY)]).node_id == "a"  # type: ignore[union-attr]


def test_threads_are_claimed() -> None:
    """CPU threads held by placed replicas are not handed out again."""
    s = spec(threads=3)
    out = refused(s, [node("a", cpus=8)], [rep("r1", "a", Phase.READY), rep("r2", "a", Phase.STARTING)])
    assert out.reasons == {"a": "has 2 of 8 CPU threads unclaimed, needs 3"}
    assert out.message == "no node can run a replica of m: no node has 3 CPU threads unclaimed; a has 2 of 8"


def test_each_filter_gives_its_reason() -> None:
    """Not connected, cordoned, engine, version, pool and selector each refuse with their own sentence."""
    s = spec(engine="llamacpp", version="0.11", pool="research", selector={"rack": "r12"})
    ok = {"labels": {"pool": "research", "rack": "r12"}, "versions": {"llamacpp": "0.11.2"}}
    nodes = [
        node("a", connected=False, **ok),  # type: ignore[arg-type]
        node("b", cordoned=True, **ok),  # type: ignore[arg-type]
        node("c", engines=("sim",), labels=ok["labels"]),  # type: ignore[arg-type]
        node("d", versions={"llamacpp": "0.110"}, labels=ok["labels"]),  # type: ignore[arg-type]
        node("e", versions=ok["versions"], labels={"rack": "r12"}),  # type: ignore[arg-type]
        node("f", versions=ok["versions"], labels={"pool": "batch", "rack": "r12"}),  # type: ignore[arg-type]
        node("g", versions=ok["versions"], labels={"pool": "research"}),  # type: ignore[arg-type]
        node("h", versions=ok["versions"], labels={"pool": "research", "rack": "r13"}),  # type: ignore[arg-type]
    ]
    out = refused(s, nodes)
    assert out.reasons == {
        "a": "is not connected", "b": "is cordoned", "c": "lacks engine llamacpp (has: sim)",
        "d": "lacks llamacpp 0.11 (has 0.110)", "e": "is in no pool, not research",
        "f": "is in pool batch, not research", "g": "has no label rack, wants rack=r12",
        "h": "has rack=r13, wants rack=r12",
    }
    assert out.message.startswith("no node can run a replica of m: no node matches pool=research, rack=r12; ")
    good = node("z", **ok)  # type: ignore[arg-type]
    assert place(s, [*nodes, good]).node_id == "z"  # type: ignore[union-attr]


def test_engine_version_is_exact_or_a_dotted_prefix() -> None:
    """0.11 takes 0.11 and 0.11.2, not 0.110 or 0.1."""
    for have, ok in (("0.11", True), ("0.11.2", True), ("0.110", False), ("0.1", False)):
        out = place(spec(engine="llamacpp", version="0.11"), [node("a", versions={"llamacpp": have})])
        assert isinstance(out, fit.Placed) is ok, have


def test_no_nodes_says_how_to_add_one() -> None:
    """With no node at all the message names the commands that add one: a join token, then the join it prints."""
    message = refused(spec(), []).message
    assert "run `llmgw token create`" in message and "`llmgw agent join --server" in message, message


def test_refusal_names_the_nearest_nodes_and_counts_the_rest() -> None:
    """The nodes that got furthest are named first; past three the rest are counted."""
    s = spec(engine="llamacpp", memory_gib=4)
    nodes = [node(f"n{i}", engines=()) for i in range(10)] + [node("z1", free_gib=1), node("z2", free_gib=3)]
    out = refused(s, nodes)
    assert out.message == ("no node can run a replica of m: no node has 4.0 GiB free memory; z2 has 3.0 GiB; "
                           "z1 has 1.0 GiB; n0 lacks engine llamacpp (has: none); and 9 more nodes cannot either")
    assert len(out.reasons) == 12


def test_weights_present_come_first() -> None:
    """binpack: a node holding the weights wins over a fuller one; spread: among nodes with as few replicas."""
    w = WeightFile("/m/a.gguf", GIB, "gguf")
    for policy in ("binpack", "spread"):
        s = spec(engine="llamacpp", source="file:///m/a.gguf", placement=policy)
        nodes = [node("a", free_gib=4), node("b", free_gib=8, weights=(w,)), node("c", free_gib=12)]
        assert place(s, nodes, estimate=None).node_id == "b", policy  # type: ignore[union-attr]


def test_spread_counts_replicas_before_weights() -> None:
    """A second replica of a spread model leaves the one node with the file, so one node lost is not all."""
    w = WeightFile("/m/a.gguf", GIB, "gguf")
    s = spec(engine="llamacpp", source="file:///m/a.gguf")
    nodes = [node("a", weights=(w,)), node("b")]
    assert place(s, nodes, [rep("r1", "a", Phase.READY)], estimate=None).node_id == "b"  # type: ignore[union-attr]
    # When every node holds one, the node with the weights is preferred again.
    both = [rep("r1", "a", Phase.READY), rep("r2", "b", Phase.READY)]
    assert place(s, [node("a", free_gib=1, weights=(w,)), node("b")], both, estimate=None).node_id == "a"  # type: ignore[union-attr]


def test_memory_is_estimated_from_the_weights() -> None:
    """No memory stated: the weights' metadata sizes it, the replica says so, and a refusal does too."""
    w = WeightFile("/m/a.gguf", 3 * GIB, "gguf", params=1, layers=1, kv_heads=1, head_dim=1)
    s = spec(engine="llamacpp", source="file:///m/a.gguf", args=("--ctx-size", "8192"))
    seen = []

    def estimate(weight: WeightFile, ctx: int, ranks: int, on_gpu: bool) -> int:
        seen.append((weight.path, ctx, ranks, on_gpu))
        return 5 * GIB

    out = place(s, [node("a", free_gib=6, weights=(w,))], estimate=estimate)
    assert out == fit.Placed("a", (), 5 * GIB, True) and seen == [("/m/a.gguf", 8192, 1, False)]
    no = refused(s, [node("a", free_gib=4, weights=(w,)), node("b", free_gib=2)], estimate=estimate)
    assert no.message.startswith("no node can run a replica of m: no node has 5.0 GiB free memory "
                                 "(estimated from its weights); a has 4.0 GiB")
    # With the real estimator (llmgw.core.estimate), the 3 GiB file needs more than 3 GiB.
    real = place(s, [node("a", free_gib=16, weights=(w,))])
    assert isinstance(real, fit.Placed) and real.memory_estimated and real.memory_bytes > 3 * GIB


def test_a_cpu_vllm_replica_is_estimated_with_its_engines_own_processes() -> None:
    """vLLM on a CPU adds its record's process overhead to the estimate; on a GPU, and for llama.cpp, nothing."""
    w = WeightFile("/m/dir", GIB, "safetensors", params=1, layers=1, heads=4, kv_heads=4, head_dim=32)

    def estimate(weight: WeightFile, ctx: int, ranks: int, on_gpu: bool) -> int:
        return GIB

    vllm_node = node("a", free_gib=16, weights=(w,), engines=("vllm",))
    cpu = place(spec(engine="vllm", source="file:///m/dir"), [vllm_node], estimate=estimate)
    assert isinstance(cpu, fit.Placed) and cpu.memory_bytes == GIB + engines.ENGINES["vllm"].cpu_process_overhead_bytes
    assert engines.ENGINES["vllm"].cpu_process_overhead_bytes >= GIB
    llama = place(spec(engine="llamacpp", source="file:///m/dir"), [node("a", free_gib=16, weights=(w,))],
                  estimate=estimate)
    assert isinstance(llama, fit.Placed) and llama.memory_bytes == GIB


def test_reconcile_records_the_estimate_and_places_higher_priority_first() -> None:
    """The pass places the higher-priority model first when only one fits, and notes an estimated memory."""
    w = WeightFile("/m/a.gguf", 3 * GIB, "gguf", params=1, layers=2, kv_heads=2, head_dim=64)
    low = spec(engine="llamacpp", source="file:///m/a.gguf", priority=1)
    high = spec(engine="llamacpp", source="file:///m/a.gguf", priority=5)
    nodes = {"a": node("a", free_gib=6, weights=(w,))}
    pending = [rep("r-low", None, Phase.PENDING, "low", created_at=0, of=low),
               rep("r-high", None, Phase.PENDING, "high", created_at=9, of=high)]
    out = decide.reconcile({"low": low, "high": high}, pending, nodes, now=0.0)
    updates = {c.record.id: c.record for c in out if isinstance(c, d.UpdateReplica)}
    assert updates["r-high"].phase is Phase.STARTING and updates["r-high"].memory_estimated
    assert "memory estimated from weights: " in updates["r-high"].message
    assert updates["r-low"].phase is Phase.PENDING and "estimated from its weights" in updates["r-low"].message


def test_a_refused_model_is_explained_once_per_pass() -> None:
    """The second replica of a model that fits nowhere gets the same refusal without another scan."""
    placer = fit.Placer([node("a", free_gib=1)])
    s = spec(memory_gib=2)
    first, second = placer.place("m", s), placer.place("m", s)
    assert isinstance(first, fit.Refused) and first is second


def test_multi_node_replicas_are_not_placed_as_one() -> None:
    """nnodes > 1 through place() is refused: a group is placed whole by place_group, never rank by rank."""
    out = refused(spec(gpus=1, nnodes=2), [node("a")])
    assert "spans 2 nodes" in out.message and "place_group" in out.message


def test_placed_condition_keeps_the_gpus_and_the_estimate() -> None:
    """After the replica's message moves on, its Placed condition still says GPUs and estimated memory."""
    from llmgw.control import conditions

    r = rep("r1", "a", Phase.READY, gpus=(2, 3))
    r.memory_bytes, r.memory_estimated = 5 * GIB, True
    placed = next(c for c in conditions.replica_conditions(r, spec(), {"a": node("a")}, now=0.0, crash_loop_after=5)
                  if c.type == "Placed")
    assert placed.message == "on node a on GPU 2, 3 as shard r1-1; memory estimated from weights: 5.0 GiB per GPU"
