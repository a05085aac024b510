"""Placement: which node takes a replica, and the sentence when none can."""

from __future__ import annotations

from llmgw.control.placement import fit
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Inventory
from llmgw.core.specs import ModelSpec, Resources

GIB = 2**30


def node(nid: str, *, free_gib: float = 8, cpus: int = 8, engines: tuple[str, ...] = ("sim", "llamacpp"),
         connected: bool = True) -> NodeView:
    inv = Inventory(cpu_count=cpus, memory_total_bytes=16 * GIB, memory_available_bytes=int(free_gib * GIB),
                    engines=tuple((e, "1") for e in engines))
    return NodeView(nid, inv, connected=connected, reported=connected)


def spec(*, engine: str = "sim", memory_gib: float = 0, threads: int = 0) -> ModelSpec:
    return ModelSpec(engine=engine, served_name="m", resources=Resources(int(memory_gib * GIB), threads))


def rep(rid: str, node_id: str, phase: Phase, model: str = "m") -> ReplicaRecord:
    return ReplicaRecord(rid, model, "fp", phase, "k", node_id=node_id, shard_id=f"{rid}-1")


def test_spreads_replicas_of_one_model() -> None:
    """A second replica goes to the node without one, even if the other has more memory."""
    nodes = [node("a", free_gib=32), node("b", free_gib=4)]
    out = fit.place("m", spec(), nodes, [rep("r1", "a", Phase.READY)], {"m": spec()})
    assert out == fit.Placed("b")


def test_prefers_most_free_memory_then_id() -> None:
    """Ties on replica count go to the node with more free memory."""
    assert fit.place("m", spec(), [node("a", free_gib=2), node("b", free_gib=6)], [], {}) == fit.Placed("b")
    assert fit.place("m", spec(), [node("b"), node("a")], [], {}) == fit.Placed("a")


def test_loading_replicas_reserve_memory() -> None:
    """Memory of replicas still Starting on a node counts as taken; Ready ones are in the report already."""
    s = spec(memory_gib=3)
    starting = [rep("r1", "a", Phase.STARTING)]
    out = fit.place("m", s, [node("a", free_gib=5)], starting, {"m": s})
    assert isinstance(out, fit.Refused)
    assert "has 2.0 GiB free memory, needs 3.0 GiB" in out.message
    ready = [rep("r1", "a", Phase.READY)]
    assert fit.place("m", s, [node("a", free_gib=5)], ready, {"m": s}) == fit.Placed("a")


def test_refusal_names_each_nodes_reason() -> None:
    """The refusal says, per node, what is missing."""
    s = spec(engine="llamacpp", memory_gib=4)
    nodes = [node("a", free_gib=1), node("b", engines=("sim",)), node("c", connected=False)]
    out = fit.place("m", s, nodes, [], {"m": s})
    assert isinstance(out, fit.Refused)
    assert out.reasons == {"a": "has 1.0 GiB free memory, needs 4.0 GiB",
                           "b": "lacks engine llamacpp (has: sim)", "c": "is not connected"}
    assert out.message.startswith("no node can run a replica of m: a has 1.0 GiB")


def test_threads_are_claimed() -> None:
    """CPU threads held by placed replicas are not handed out again."""
    s = spec(threads=3)
    placed = [rep("r1", "a", Phase.READY), rep("r2", "a", Phase.STARTING)]
    out = fit.place("m", s, [node("a", cpus=8)], placed, {"m": s})
    assert isinstance(out, fit.Refused) and "has 2 of 8 CPU threads unclaimed, needs 3" in out.message


def test_no_nodes_says_how_to_add_one() -> None:
    """With no node at all the message names the command that adds one."""
    out = fit.place("m", spec(), [], [], {})
    assert isinstance(out, fit.Refused) and "llmgw agent --server" in out.message


def test_long_refusals_are_summarised() -> None:
    """Past three nodes the message counts the rest instead of listing a thousand."""
    s = spec(engine="llamacpp")
    out = fit.place("m", s, [node(f"n{i}", engines=()) for i in range(10)], [], {"m": s})
    assert isinstance(out, fit.Refused) and "and 7 more nodes cannot either" in out.message
