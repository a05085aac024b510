"""Remote weights in placement: the metadata read stands for the file, fetches in flight count, disk is checked."""

from __future__ import annotations

import dataclasses

from test_placement_data import GIB, node, rep, spec

from llmgw.control.placement import explain, fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, Phase
from llmgw.core.inventory import ModelDir, WeightFile
from llmgw.core.shards import FetchProgress, ShardSpec, ShardState, ShardStatus

SRC = "hf://org/smol"
CACHE = "/var/lib/llmgw/weights"
#: What the control plane read of SRC: 14.2 GiB of bfloat16 safetensors, a small Llama's shape.
READ = WeightFile(path="", size_bytes=int(14.2 * GIB), format="safetensors", layers=30, heads=9, kv_heads=3,
                  head_dim=64, hidden_size=576, context_length=8192, dtype_bytes=2, source=SRC)
REMOTE = {SRC: fit.RemoteWeights(READ)}


def with_disk(v: NodeView, free_gib: float, *, total_gib: float = 100, path: str = CACHE) -> NodeView:
    inv = dataclasses.replace(v.inventory, model_dirs=(ModelDir(path, int(total_gib * GIB), int(free_gib * GIB)),))
    return dataclasses.replace(v, inventory=inv)


def fetching(v: NodeView, source: str = SRC, *, done: int = 0, total: int = 0) -> NodeView:
    """``v`` with a shard fetching ``source``."""
    st = ShardStatus("x-1", "x", ShardState.FETCHING, spec=ShardSpec("x-1", "x", "other", "sim", "m", source=source),
                     fetch=FetchProgress(done, total))
    return dataclasses.replace(v, shards={"x-1": st})


def test_a_node_fetching_the_weights_scores_like_one_that_holds_them() -> None:
    """Spread sends a replica of a remote model to the node already fetching it, not to the freer one."""
    s = spec(source=SRC, memory_gib=1)
    nodes = [with_disk(node("a", free_gib=32), 50), fetching(with_disk(node("b", free_gib=4), 50))]
    out = fit.place("m", s, nodes, remote=REMOTE)
    assert isinstance(out, fit.Placed) and out.node_id == "b"
    # Without the fetch under way the freer node wins: the fetch is what moved it.
    plain = [with_disk(node("a", free_gib=32), 50), with_disk(node("b", free_gib=4), 50)]
    assert fit.place("m", s, plain, remote=REMOTE).node_id == "a"  # type: ignore[union-attr]


def test_fetched_weights_are_matched_by_their_source() -> None:
    """Weights in a node's inventory that llmgw fetched from the source count as present there."""
    held = WeightFile(f"{CACHE}/hf-org-smol-1a2b", READ.size_bytes, "safetensors", fetched_by_llmgw=True,
                      source=SRC, cache_name="hf-org-smol-1a2b")
    nodes = [node("a", free_gib=32), node("b", free_gib=4, weights=(held,))]
    assert fit.place("m", spec(source=SRC, memory_gib=1), nodes, remote=REMOTE).node_id == "b"  # type: ignore[union-attr]


def test_a_node_without_room_for_the_weights_is_filtered_out_with_the_numbers() -> None:
    """Free space in the weights directory below the weights' size refuses the node, saying both and where."""
    out = fit.place("m", spec(source=SRC, memory_gib=1), [with_disk(node("a"), 9.8)], remote=REMOTE)
    assert isinstance(out, fit.Refused)
    assert out.reasons == {"a": f"needs 14.2 GiB for the weights, has 9.8 GiB free on {CACHE}"}
    assert out.message.startswith("no node can run a replica of m: no node has 14.2 GiB free disk for the weights")
    assert f"a has 9.8 GiB free on {CACHE}" in out.message


def test_disk_counts_fetches_in_flight_and_this_pass() -> None:
    """Another download still to land, and another remote model placed earlier in the pass, take the room."""
    other = "hf://org/other"
    remote = {**REMOTE, other: fit.RemoteWeights(dataclasses.replace(READ, source=other))}
    busy = fetching(with_disk(node("a"), 20), other, done=4 * GIB, total=10 * GIB)
    out = fit.place("m", spec(source=SRC, memory_gib=1), [busy], remote=remote)
    assert isinstance(out, fit.Refused) and out.reasons["a"].endswith(f"has 14.0 GiB free on {CACHE}")
    placer = fit.Placer([with_disk(node("a"), 20)], remote=remote)
    assert isinstance(placer.place("m", spec(source=SRC, memory_gib=1)), fit.Placed)
    # A second replica of the same model shares the download; another model does not fit beside it.
    assert isinstance(placer.place("m", spec(source=SRC, memory_gib=1)), fit.Placed)
    assert isinstance(placer.place("n", spec(source=other, memory_gib=1)), fit.Refused)


def test_a_node_that_holds_the_weights_needs_no_disk_for_them() -> None:
    """The node already fetching the weights is not refused for the room they are taking."""
    out = fit.place("m", spec(source=SRC, memory_gib=1), [fetching(with_disk(node("a"), 1))], remote=REMOTE)
    assert isinstance(out, fit.Placed)


def test_memory_is_estimated_from_the_metadata_read_remotely() -> None:
    """No node holds the weights, yet a model that states no memory gets an estimate from what was read."""
    out = fit.place("m", spec(source=SRC), [with_disk(node("a", free_gib=32), 50)], remote=REMOTE)
    assert isinstance(out, fit.Placed) and out.memory_estimated and out.memory_bytes > READ.size_bytes
    # Unread (no reader in this placer): placed without an estimate.
    assert fit.place("m", spec(source=SRC), [node("a", free_gib=32)]).memory_estimated is False  # type: ignore[union-attr]


def test_the_engine_check_reads_the_remote_metadata() -> None:
    """tensor_parallel 2 over 9 heads is refused before any node is tried, from config.json's numbers alone."""
    s = spec(engine="vllm", source=SRC, gpus=2, gpu_gib=20)
    out = fit.place("m", s, [node("a", engines=("vllm",))], remote=REMOTE)
    assert isinstance(out, fit.Refused) and out.reason == explain.ENGINE_REFUSED, out
    assert "9" in out.message


def test_a_replica_waits_for_its_metadata_then_places_without_it_when_unreadable() -> None:
    """Not read yet: ReadingMetadata; read and failed: placed, with why its memory was not estimated."""
    s = spec(source=SRC, replicas=1)
    pending = [rep("r1", None, Phase.PENDING, of=s)]
    nodes = {"a": node("a", free_gib=32)}
    out = decide.reconcile({"m": s}, pending, nodes, now=0.0, remote={})
    (upd,) = [c.record for c in out if isinstance(c, d.UpdateReplica)]
    assert upd.phase is Phase.PENDING and explain.reason_of(upd.message) == explain.READING_METADATA
    failed = {SRC: fit.RemoteWeights(None, "GET http://mirror/api/models/org/smol/revision/main: HTTP 404")}
    out = decide.reconcile({"m": s}, pending, nodes, now=0.0, remote=failed)
    (start,) = [c for c in out if isinstance(c, d.StartShard)]
    (upd,) = [c.record for c in out if isinstance(c, d.UpdateReplica)]
    assert start.node_id == "a" and "memory not estimated: cannot read the metadata of hf://org/smol" in upd.message
    assert "HTTP 404" in upd.message
    assert any(isinstance(c, d.RecordEvent) and c.event.reason == "WeightsMetadataUnknown" for c in out)
