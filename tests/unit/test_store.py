"""The store on a real SQLite file: migrations, round trips, and reopening."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Disk, Gpu, Inventory

MODEL = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                              "spec": {"engine": "sim", "replicas": 2}})


def test_migrations_create_the_schema(tmp_path: Path) -> None:
    """Opening a new data directory creates the database at the latest revision."""
    store = Store.open(tmp_path / "data")
    with store.engine.connect() as c:
        tables = set(sa.inspect(c).get_table_names())
        rev = c.execute(sa.text("select version_num from alembic_version")).scalar()
    assert {"models", "nodes", "replicas", "api_keys"} <= tables and rev == "0002"
    store.close()


def test_models_round_trip_and_generation(tmp_path: Path) -> None:
    """A model reads back equal; an unchanged re-apply keeps its generation, an edit bumps it."""
    store = Store.open(tmp_path)
    stored, created = store.put_model(MODEL, now=1.0)
    assert created and stored.generation == 1 and store.get_model("m").model == MODEL  # type: ignore[union-attr]
    assert store.put_model(MODEL, now=2.0)[0].generation == 1
    edited = specs.Model("m", specs.ModelSpec(engine="sim", served_name="other"))
    again, created = store.put_model(edited, now=3.0)
    assert not created and again.generation == 2 and again.updated_at == 3.0
    assert store.delete_model("m") and not store.delete_model("m") and store.get_model("m") is None


def test_replicas_and_nodes_survive_reopen(tmp_path: Path) -> None:
    """What was written is there after the store is closed and opened again (a server restart)."""
    store = Store.open(tmp_path)
    r = ReplicaRecord("m-1", "m", "fp", Phase.READY, "key", node_id="n1", shard_id="m-1-1", attempt=1,
                      endpoint="http://127.0.0.1:5", last_output=("a", "b"), created_at=5.0)
    store.write_replicas(upserts=[r, ReplicaRecord("m-2", "m", "fp", Phase.PENDING, "k2", created_at=6.0)])
    inv = Inventory(4, 8, 6, disks=(Disk("/", 10, 5),), gpus=(Gpu(0, "GPU-1", "H100", 80, 1, "9.0"),),
                    engines=(("sim", "1"),))
    store.upsert_node(StoredNode("n1", "host1", "10.0.0.1", "0.1", inv, {"rack": "a"}, 1.0, 2.0))
    store.close()
    reopened = Store.open(tmp_path)
    assert reopened.list_replicas()[0] == r
    assert [x.id for x in reopened.list_replicas()] == ["m-1", "m-2"]
    node = reopened.list_nodes()[0]
    assert node.inventory == inv and node.labels == {"rack": "a"}
    reopened.write_replicas(deletes=["m-1"])
    assert [x.id for x in reopened.list_replicas()] == ["m-2"]
