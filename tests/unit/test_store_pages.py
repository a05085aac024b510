"""The store's light reads for the UI's overview: a page of nodes, the occupied nodes, replicas' states."""

from __future__ import annotations

from pathlib import Path

from llmgw.control.state import Member, Phase, ReplicaRecord
from llmgw.control.status import summarize
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Gpu, Inventory


def _node(node_id: str, *, cordoned: bool = False) -> StoredNode:
    inv = Inventory(4, 8, 6, gpus=(Gpu(0, "GPU-1", "H100", 80, 1, "9.0"),))
    return StoredNode(node_id, f"host-{node_id}", "10.0.0.1", "0.1", inv, {"rack": "a"}, 1.0, 2.0, cordoned)


def test_a_page_of_nodes_is_the_same_as_the_slice_of_all_of_them(tmp_path: Path) -> None:
    """page_nodes gives the nodes by id from offset, limit of them (0: all), and the total, as list_nodes has them."""
    store = Store.open(tmp_path)
    for i in (7, 3, 11, 0, 5):
        store.upsert_node(_node(f"n{i:02d}"))
    store.set_node_scheduling("n05", cordoned=True, draining=True)
    every = store.list_nodes()
    assert store.page_nodes() == (every, 5)
    assert store.page_nodes(offset=1, limit=2) == (every[1:3], 5)
    assert store.page_nodes(offset=4, limit=10) == (every[4:], 5)
    assert store.page_nodes(offset=5, limit=10) == ([], 5)
    (five,), _ = store.page_nodes(offset=2, limit=1)
    assert (five.id, five.cordoned, five.draining, five.labels) == ("n05", True, True, {"rack": "a"})
    store.close()


def test_occupied_nodes_count_every_rank_of_a_group(tmp_path: Path) -> None:
    """A node is occupied when a replica is on it, as leader or as another rank; a Pending one occupies none."""
    store = Store.open(tmp_path)
    group = ReplicaRecord("g-1", "g", "fp", Phase.READY, "k", node_id="a", members=(
        Member(rank=0, node_id="a", shard_id="g-1-1-r0"), Member(rank=1, node_id="b", shard_id="g-1-1-r1")))
    store.write_replicas(upserts=[group, ReplicaRecord("m-1", "m", "fp", Phase.STARTING, "k", node_id="c"),
                                  ReplicaRecord("m-2", "m", "fp", Phase.PENDING, "k")])
    assert store.occupied_nodes() == {"a", "b", "c"}
    store.close()


def test_replica_states_summarize_as_the_whole_records(tmp_path: Path) -> None:
    """The light records give a model the same status (state, sentence, counts) as the whole ones."""
    store = Store.open(tmp_path)
    spec = specs.ModelSpec(engine="sim", served_name="m", replicas=4)
    store.write_replicas(upserts=[
        ReplicaRecord("m-1", "m", "fp", Phase.READY, "k", node_id="a", created_at=1.0, last_output=("x",)),
        ReplicaRecord("m-2", "m", "fp", Phase.STARTING, "k", node_id="b", started_at=5.0, created_at=2.0),
        ReplicaRecord("m-3", "m", "fp", Phase.PENDING, "k", failures=2, next_attempt_at=99.0,
                      message="no node has a free GPU", created_at=3.0),
        ReplicaRecord("m-4", "m", "fp", Phase.UNHEALTHY, "k", node_id="d", failures=5, message="probe failing",
                      created_at=4.0),
        ReplicaRecord("n-1", "n", "fp", Phase.READY, "k", node_id="a", created_at=5.0),
        ReplicaRecord("n-2", "n", "fp", Phase.READY, "k", node_id="b", created_at=6.0),
        ReplicaRecord("n-3", "n", "fp", Phase.TERMINATING, "k", node_id="c", created_at=7.0)])
    whole, light = store.list_replicas(), store.list_replica_states()
    assert sorted(r.phase.value for r in light) == sorted(r.phase.value for r in whole)
    assert [r.id for r in light if r.phase is not Phase.READY] == ["m-2", "m-3", "m-4", "n-3"]  # oldest first

    def of(model: str, records: list[ReplicaRecord]) -> list[ReplicaRecord]:
        return [r for r in records if r.model == model]

    assert summarize(spec, of("m", light), now=50.0) == summarize(spec, of("m", whole), now=50.0)
    assert summarize(spec, of("m", light), now=50.0).state == "Degraded"
    two = specs.ModelSpec(engine="sim", served_name="n", replicas=2)
    assert summarize(two, of("n", light), now=50.0) == summarize(two, of("n", whole), now=50.0)
    assert summarize(two, of("n", light), now=50.0).ready == 2
    assert all(r.api_key == "" for r in light)  # never a record to write back: the key is not read
    store.close()
