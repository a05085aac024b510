"""The store on a real SQLite file: migrations, round trips, and reopening."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from llmgw.control.conditions import Condition
from llmgw.control.events import Event
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
    assert {"models", "nodes", "replicas", "api_keys", "events", "bootstrap_tokens", "users", "audit", "api_tokens",
            "node_certs", "engine_wants", "settings", "leases", "controlplanes", "autoscale",
            "cluster_settings", "sso_pending", "sso_links"} <= tables
    assert rev == "0016"
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
                      endpoint="http://127.0.0.1:5", last_output=("a", "b"), created_at=5.0, gpus=(2, 3),
                      memory_bytes=80 << 30, memory_estimated=True)
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


def _node(node_id: str = "n1") -> StoredNode:
    return StoredNode(node_id, "host1", "10.0.0.1", "0.1", Inventory(4, 8, 6), {}, 1.0, 2.0)


def test_cordon_and_drain_marks_survive_reopen_and_reregistration(tmp_path: Path) -> None:
    """A cordoned, draining node stays so after a restart and after its agent registers again."""
    store = Store.open(tmp_path)
    assert not store.set_node_scheduling("n1", cordoned=True, draining=False)  # not registered: refused
    store.upsert_node(_node())
    assert store.set_node_scheduling("n1", cordoned=True, draining=True)
    store.close()
    reopened = Store.open(tmp_path)
    reopened.upsert_node(_node())  # the agent registers again: its report must not clear the marks
    (n,) = reopened.list_nodes()
    assert (n.cordoned, n.draining) == (True, True)
    reopened.set_node_scheduling("n1", cordoned=False, draining=False)
    assert not reopened.list_nodes()[0].cordoned


def test_conditions_round_trip_apart_from_the_target(tmp_path: Path) -> None:
    """Conditions read back equal, and writing a replica's target leaves its conditions alone."""
    store = Store.open(tmp_path)
    store.put_model(MODEL, now=1.0)
    r = ReplicaRecord("m-1", "m", "fp", Phase.READY, "key", created_at=5.0)
    store.write_replicas(upserts=[r])
    ready = (Condition("Ready", "True", "Serving", "serving", 7.0),)
    store.set_conditions(replicas={"m-1": ready, "gone": ready}, models={"m": ready})
    store.write_replicas(upserts=[ReplicaRecord("m-1", "m", "fp", Phase.STARTING, "key", created_at=5.0)])
    store.close()
    reps, models = Store.open(tmp_path).conditions()
    assert reps == {"m-1": ready} and models == {"m": ready}


def test_events_are_filtered_and_bounded(tmp_path: Path) -> None:
    """Events come back oldest first with increasing ids; filters by model and node; only the newest are kept."""
    store = Store.open(tmp_path)
    written = store.add_events([
        Event(1.0, "Normal", "Created", "replica/m-1", "made", model="m"),
        Event(2.0, "Normal", "NodeRegistered", "node/n1", "hello"),
        Event(3.0, "Warning", "Failed", "replica/m-1", "boom", model="m", node="n1"),
        Event(4.0, "Normal", "ReplicasReady", "model/other", "ok", model="other"),
    ])
    assert [e.id for e in written] == [1, 2, 3, 4]
    assert [e.reason for e in store.list_events(model="m")] == ["Created", "Failed"]
    assert [e.reason for e in store.list_events(node="n1")] == ["NodeRegistered", "Failed"]
    assert [e.reason for e in store.list_events(since=3.0)] == ["Failed", "ReplicasReady"]
    assert [e.id for e in store.list_events(after_id=3)] == [4]
    assert [e.id for e in store.list_events(limit=2)] == [3, 4]
    store.add_events([Event(float(i), "Normal", "X", "node/n1", str(i)) for i in range(10)], keep=5)
    assert [e.message for e in store.list_events()] == ["5", "6", "7", "8", "9"]


def test_a_data_directory_from_0002_is_upgraded_with_its_replicas(tmp_path: Path) -> None:
    """Opening a database written at revision 0002 adds the new columns; its rows read back with defaults."""
    from alembic import command
    from alembic.config import Config

    old = Store(f"sqlite:///{tmp_path / 'llmgw.db'}")
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parents[2] / "llmgw/control/store/migrations"))
    with old.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        conn.execute(sa.text("insert into nodes values ('n1', 'h', 'a', 'v', '{}', '{}', 1, 2)"))
        conn.execute(sa.text("insert into replicas values ('m-1', 'm', 'fp', 'Ready', 'n1', 'm-1-1', 'k', 1, 0,"
                             " 0, 0, 0, 0, 'http://e', '', '[]', 5, 5)"))
    old.close()
    store = Store.open(tmp_path)
    assert store.list_replicas()[0].endpoint == "http://e" and store.conditions()[0] == {"m-1": ()}
    assert not store.list_nodes()[0].cordoned


def test_every_replica_record_field_has_a_column() -> None:
    """A field added to ReplicaRecord without a column (and a migration) would be lost at every restart."""
    import dataclasses

    from llmgw.control.store.tables import ReplicaRow

    columns = set(ReplicaRow.__table__.columns.keys())
    assert {f.name for f in dataclasses.fields(ReplicaRecord)} <= columns
