"""The store on a real PostgreSQL (a server of the tests' own), against the same calls on SQLite.

Each store test runs on both: what PostgreSQL changes (JSON columns, booleans, rowcounts, sequences
for autoincrement ids, string lengths enforced) must change nothing a caller sees.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from llmgw.control.conditions import Condition
from llmgw.control.events import Event
from llmgw.control.reconcile.engines import ScopedWant
from llmgw.control.state import Member, Phase, ReplicaRecord
from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Store
from llmgw.control.store.tables import SettingRow
from llmgw.core import specs
from llmgw.core.inventory import Disk, Gpu, Inventory
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import Proc, free_port

LLMGW = [sys.executable, "-m", "llmgw"]
MODEL = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                              "spec": {"engine": "sim", "replicas": 2}})
HEAD = "0016"
_db_names = itertools.count(1)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return store_mod.sqlite_url(tmp_path)
    pg: Postgres = request.getfixturevalue("pg")
    return pg.create_database(f"t{next(_db_names)}")


@pytest.fixture
def opened(url: str) -> Iterator[Callable[[], Store]]:
    """Opens the database (again, as a restarted server would); every store opened is closed at the end."""
    stores: list[Store] = []

    def open_() -> Store:
        stores.append(Store.open_url(url))
        return stores[-1]

    yield open_
    for s in stores:
        s.close()


def test_migrations_reach_the_head(opened: Callable[[], Store]) -> None:
    """An empty database gets every table at the newest revision."""
    store = opened()
    with store.engine.connect() as c:
        tables = set(sa.inspect(c).get_table_names())
        rev = c.execute(sa.text("select version_num from alembic_version")).scalar()
    assert {"models", "nodes", "replicas", "api_keys", "events", "bootstrap_tokens", "users", "audit", "api_tokens",
            "node_certs", "engine_wants", "settings"} <= tables
    assert rev == HEAD


def test_models_replicas_nodes_round_trip_across_a_restart(opened: Callable[[], Store]) -> None:
    """Models (generation), replicas (JSON lists, members, booleans) and nodes read back equal after reopening."""
    store = opened()
    stored, created = store.put_model(MODEL, now=1.0)
    assert created and stored.generation == 1
    assert store.put_model(MODEL, now=2.0)[0].generation == 1
    edited = specs.Model("m", specs.ModelSpec(engine="sim", served_name="other"))
    assert store.put_model(edited, now=3.0)[0].generation == 2
    r = ReplicaRecord("m-1", "m", "fp", Phase.READY, "key", node_id="n1", shard_id="m-1-1", attempt=1,
                      endpoint="http://127.0.0.1:5", last_output=("a", "b"), created_at=5.0, gpus=(2, 3),
                      memory_bytes=80 << 30, memory_estimated=True,
                      members=(Member(0, "n1", "m-1-1", (0,), ("mlx5_0",)),), leader_addr="10.0.0.1", leader_port=7)
    store.write_replicas(upserts=[r, ReplicaRecord("m-2", "m", "fp", Phase.PENDING, "k2", created_at=6.0)])
    inv = Inventory(4, 8, 6, disks=(Disk("/", 10, 5),), gpus=(Gpu(0, "GPU-1", "H100", 80, 1, "9.0"),),
                    engines=(("sim", "1"),))
    store.upsert_node(store_mod.StoredNode("n1", "host1", "10.0.0.1", "0.1", inv, {"rack": "a"}, 1.0, 2.0))
    assert store.set_node_scheduling("n1", cordoned=True, draining=True)
    assert not store.set_node_scheduling("nobody", cordoned=True, draining=False)
    store.touch_nodes({"n1": 9.0, "nobody": 9.0})
    store.close()

    again = opened()
    assert again.get_model("m").model == edited  # type: ignore[union-attr]
    assert [m.model.name for m in again.list_models()] == ["m"]
    assert again.list_replicas()[0] == r and [x.id for x in again.list_replicas()] == ["m-1", "m-2"]
    (node,) = again.list_nodes()
    assert node.inventory == inv and node.labels == {"rack": "a"} and node.last_seen == 9.0
    assert (node.cordoned, node.draining) == (True, True)
    again.write_replicas(deletes=["m-1", "never"])
    assert [x.id for x in again.list_replicas()] == ["m-2"]
    assert again.delete_model("m") and not again.delete_model("m") and again.get_model("m") is None


def test_conditions_and_events(opened: Callable[[], Store]) -> None:
    """Conditions round-trip; events get increasing ids from 1, filter, are pruned; a NUL in text is stored."""
    store = opened()
    store.put_model(MODEL, now=1.0)
    store.write_replicas(upserts=[ReplicaRecord("m-1", "m", "fp", Phase.READY, "key", created_at=5.0)])
    ready = (Condition("Ready", "True", "Serving", "serving", 7.0),)
    store.set_conditions(replicas={"m-1": ready, "gone": ready}, models={"m": ready})
    assert store.conditions() == ({"m-1": ready}, {"m": ready})
    written = store.add_events([
        Event(1.0, "Normal", "Created", "replica/m-1", "made", model="m"),
        Event(2.0, "Normal", "NodeRegistered", "node/n1", "hello"),
        Event(3.0, "Warning", "Failed", "replica/m-1", "boom", model="m", node="n1"),
    ])
    assert [e.id for e in written] == [1, 2, 3]
    assert [e.reason for e in store.list_events(model="m")] == ["Created", "Failed"]
    assert [e.reason for e in store.list_events(node="n1")] == ["NodeRegistered", "Failed"]
    assert [e.id for e in store.list_events(after_id=2)] == [3]
    store.add_events([Event(float(i), "Normal", "X", "node/n1", str(i)) for i in range(10)], keep=5)
    assert [e.message for e in store.list_events()] == ["5", "6", "7", "8", "9"]
    # An engine's output can carry a NUL, which PostgreSQL's text columns refuse: stored replaced, not failed.
    store.write_replicas(upserts=[ReplicaRecord("m-1", "m", "fp", Phase.PENDING, "key", created_at=5.0,
                                                message="exited: \x00bad", last_output=("a\x00b",))])
    (nul,) = store.add_events([Event(9.0, "Warning", "Failed", "replica/m-1", "a\x00b")])
    assert store.list_replicas()[0].message == "exited: \ufffdbad" and nul.message == "a\ufffdb"
    assert store.list_replicas()[0].last_output == ("a\x00b",)
    assert store.record_audit(actor="a", action="apply", object="model/m", outcome="failed",
                              detail="\x00").detail == "\ufffd"


def test_credentials_keys_users_and_tokens(opened: Callable[[], Store]) -> None:
    """Keys, users, bootstrap tokens (a conditional spend), REST tokens and node certs: counts as on SQLite."""
    store = opened()
    store.add_key(store_mod.StoredKey("k1", "team", "ab" * 32, models=("m",), rpm=5, created_at=1.0, disabled=True))
    (key,) = store.list_keys()
    assert key.models == ("m",) and key.disabled and store.delete_key("k1") and not store.delete_key("k1")

    store.add_token(store_mod.StoredToken("t1", "cd" * 32, "", expires_at=100.0, uses_left=1, created_at=1.0))
    assert store.spend_token("t1", now=2.0) and not store.spend_token("t1", now=2.0)
    assert store.get_token("t1").uses_left == 0  # type: ignore[union-attr]

    store.put_user(store_mod.StoredUser("alice", "viewer", "h1", 1.0))
    store.put_user(store_mod.StoredUser("alice", "admin", "h2", 5.0))
    assert store.get_user("alice") == store_mod.StoredUser("alice", "admin", "h2", 1.0)
    for i, kind in enumerate(("user", "session", "session")):
        store.add_api_token(store_mod.StoredApiToken(f"a{i}", "ef" * 32, kind, "alice", created_at=float(i)))
    store.add_api_token(store_mod.StoredApiToken("r1", "01" * 32, "router", "edge", created_at=9.0, label="edge"))
    store.touch_api_token("a0", at=42.0)
    assert store.get_api_token("a0").last_used_at == 42.0  # type: ignore[union-attr]
    assert [t.id for t in store.list_api_tokens(kind="session")] == ["a1", "a2"]
    assert store.delete_api_tokens(subject="alice", kinds=["session"]) == 2
    assert store.delete_api_token("r1") and not store.delete_api_token("r1")
    assert store.delete_user("alice") and not store.delete_user("alice")
    assert store.list_api_tokens() == [] and store.list_users() == []

    store.add_node_cert(store_mod.StoredNodeCert("0a", "n1", 1.0, 10.0))
    store.add_node_cert(store_mod.StoredNodeCert("0b", "n1", 2.0, 10.0))
    store.add_node_cert(store_mod.StoredNodeCert("0c", "n2", 3.0, 10.0))
    assert store.revoke_node_certs("n1", at=5.0) == 2 and store.revoke_node_certs("n1", at=6.0) == 0
    assert [c.revoked_at for c in store.list_node_certs(node_id="n1")] == [5.0, 5.0]
    assert store.get_node_cert("0c").revoked_at == 0.0  # type: ignore[union-attr]


def test_keys_last_use_and_disable(opened: Callable[[], Store]) -> None:
    """A key's last use only moves forward and survives a restart; disable and enable answer the key."""
    store = opened()
    store.add_key(store_mod.StoredKey("k1", "team", "ab" * 32, created_at=1.0))
    assert store.list_keys()[0].last_used_at == 0.0
    store.touch_keys({"k1": 1764583200.5, "gone": 5.0})
    store.touch_keys({"k1": 10.0})
    assert store.set_key_disabled("k1", True) == store_mod.StoredKey("k1", "team", "ab" * 32, created_at=1.0,
                                                                     disabled=True, last_used_at=1764583200.5)
    (key,) = opened().list_keys()
    assert key.disabled and key.last_used_at == 1764583200.5
    assert store.set_key_disabled("gone", False) is None


def test_a_key_made_before_0011_reads_as_never_used(url: str) -> None:
    """Migration 0011 adds last_used_at to existing keys as 0 (never used)."""
    engine = sa.create_engine(url)
    try:
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(store_mod.MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            alembic_command.upgrade(cfg, "0010")
            conn.execute(sa.text("INSERT INTO api_keys (id, name, sha256, models, rpm, tpm, priority, created_at, "
                                 "disabled) VALUES ('k0', 'old', :h, '[]', 0, 0, 0, 1.0, false)"), {"h": "cd" * 32})
    finally:
        engine.dispose()
    store = Store.open_url(url)
    try:
        (key,) = store.list_keys()
        assert key.id == "k0" and key.last_used_at == 0.0 and not key.disabled
    finally:
        store.close()


def test_audit_engine_wants_and_settings(opened: Callable[[], Store]) -> None:
    """Audit entries get increasing ids; engine wants are unique; settings are replaced by key."""
    store = opened()
    a = store.record_audit(actor="alice", action="apply", object="model/m", outcome="ok", at=1.0)
    b = store.record_audit(actor="bob", action="delete", object="model/m", outcome="refused", detail="no", at=2.0)
    assert (a.id, b.id) == (1, 2) and store.list_audit(since_id=1) == [b]
    want = ScopedWant("cluster", "vllm", "0.11.0", 5.0)
    assert store.add_engine_want(want) and not store.add_engine_want(want)
    assert store.list_engine_wants() == [want]
    assert store.delete_engine_want("cluster", "vllm", "0.11.0") and not store.delete_engine_want(
        "cluster", "vllm", "0.11.0")
    store.put_settings({"a": "1", "b": "2"})
    store.put_settings({"a": "3"})
    assert store.settings() == {"a": "3", "b": "2"}


#: One server's start, as a process of its own: wait for the agreed instant, then open (and migrate) the store.
_OPEN_AT = """
import sys, time
from llmgw.control.store.store import Store
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
Store.open_url(sys.argv[1]).close()
print("opened")
"""


def test_servers_starting_together_migrate_an_empty_database_once(pg: Postgres) -> None:
    """Four processes opening the store at the same instant on an empty PostgreSQL all succeed, schema at head once."""
    url = pg.create_database(f"race{next(_db_names)}")
    # Processes, not threads: two servers are two processes (and Alembic's context is not thread-safe).
    at = time.time() + 3  # after every interpreter has imported the store
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_AT, url, repr(at)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for _ in range(4)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [(p.returncode, out) for p, (out, _) in zip(procs, outs, strict=True)] == [(0, "opened\n")] * 4, \
        [err[-2000:] for _, err in outs]
    reader = Store.open_url(url)
    try:
        with reader.engine.connect() as c:
            assert c.execute(sa.text("select version_num from alembic_version")).scalars().all() == [HEAD]
    finally:
        reader.close()


def test_a_url_of_another_kind_is_refused_with_the_kinds_accepted() -> None:
    """A MySQL URL is refused before any connection, naming the URL shape that works, never echoing the URL."""
    with pytest.raises(store_mod.StoreUrlRefused, match=r"postgresql\+psycopg://USER") as got:
        Store.open_url("mysql://root:secret@127.0.0.1/x")
    assert "secret" not in str(got.value)


def test_the_server_serves_its_models_from_postgres(pg: Postgres, tmp_path: Path) -> None:
    """`llmgw server --database postgresql+psycopg://…` starts, and a model applied over REST lands in PostgreSQL."""
    url = pg.create_database(f"srv{next(_db_names)}")
    http = free_port()
    server = Proc.start([*LLMGW, "server", "--insecure", "--data-dir", str(tmp_path / "d"), "--database", url,
                         "--http-port", str(http), "--agent-port", str(free_port())], log_path=tmp_path / "srv.log")
    try:
        server.wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60)
        base = f"http://127.0.0.1:{http}/api/v1/models"
        assert httpx.get(base).json()["items"] == []
        applied = httpx.post(base, json=MODEL.to_manifest(), timeout=30)
        assert applied.status_code in (200, 201), applied.text
        assert [m["metadata"]["name"] for m in httpx.get(base).json()["items"]] == ["m"]
    finally:
        server.stop(timeout=20)
    reader = Store.open_url(url)
    try:
        assert [m.model.name for m in reader.list_models()] == ["m"]
    finally:
        reader.close()
    assert not (tmp_path / "d" / "llmgw.db").exists()  # SQLite in the data directory was never made


def test_the_server_refuses_a_database_it_cannot_use(tmp_path: Path) -> None:
    """--database of another kind, or a PostgreSQL nobody listens on, stops the server at start with the reason."""
    base = [*LLMGW, "server", "--insecure", "--data-dir", str(tmp_path / "d"), "--http-port", str(free_port()),
            "--agent-port", str(free_port())]
    other = subprocess.run([*base, "--database", "mysql://root:secret@127.0.0.1/x"], capture_output=True,
                           text=True, timeout=60)
    assert other.returncode == 1 and "is not supported" in other.stderr and "secret" not in other.stderr, other.stderr
    nobody = f"postgresql+psycopg://llmgw:secret@127.0.0.1:{free_port()}/x"
    down = subprocess.run([*base, "--database", nobody], capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "cannot reach the database" in down.stderr, down.stderr
    assert "secret" not in down.stderr and "Traceback" not in down.stderr


def test_a_secure_server_on_postgres_keeps_its_users_there(pg: Postgres, tmp_path: Path) -> None:
    """A first secure start with --database puts the administrator in PostgreSQL (not a SQLite file beside the
    CA): the password it leaves in its 0600 file (no terminal) logs in, and `llmgw token create --database`
    writes its token there too."""
    url = pg.create_database(f"sec{next(_db_names)}")
    http, data = free_port(), tmp_path / "d"
    server = Proc.start([*LLMGW, "server", "--data-dir", str(data), "--database", url, "--http-port", str(http),
                         "--agent-port", str(free_port()), "--join-port", str(free_port())],
                        log_path=tmp_path / "srv.log")
    try:
        server.wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60)
        password = (data / "initial-admin-password").read_text().strip()
        login = httpx.post(f"http://127.0.0.1:{http}/api/v1/login", json={"username": "admin", "password": password},
                           timeout=30)
        assert login.status_code == 200, login.text
        models = httpx.get(f"http://127.0.0.1:{http}/api/v1/models", timeout=30,
                           headers={"Authorization": f"Bearer {login.json()['token']}"})
        assert models.status_code == 200, models.text
        made = subprocess.run([*LLMGW, "token", "create", "--data-dir", str(data), "--database", url],
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0 and "llmgw agent join" in made.stdout, made.stderr
        token_id = made.stdout.split("--token ", 1)[1].split(".", 1)[0]
    finally:
        server.stop(timeout=20)
    assert not (data / "llmgw.db").exists()
    reader = Store.open_url(url)
    try:
        assert reader.get_user("admin") is not None and reader.get_token(token_id) is not None
    finally:
        reader.close()


# -- the leader lease (the foundation of issue 15's leader election) ---------------------------------------


def test_the_lease_is_taken_renewed_by_its_holder_and_taken_over_with_a_new_term(opened: Callable[[], Store]) -> None:
    """One holder at a time; only the holder renews (same term); once expired another takes it with term + 1,
    and the old holder can neither renew nor release it (its term is fenced off)."""
    a, b = opened(), opened()
    first = a.take_lease("cp-a", now=100.0, lease_s=10.0, address="cp-a:8080")
    assert first is not None and (first.holder, first.term, first.expires_at) == ("cp-a", 1, 110.0)
    assert b.take_lease("cp-b", now=105.0, lease_s=10.0) is None  # held, unexpired
    renewed = a.take_lease("cp-a", now=108.0, lease_s=10.0, address="cp-a:8080", term=1)
    assert renewed is not None and (renewed.term, renewed.expires_at) == (1, 118.0)
    assert b.take_lease("cp-b", now=109.0, lease_s=10.0, term=1) is None  # renewing what it does not hold
    assert b.take_lease("cp-b", now=117.9, lease_s=10.0) is None
    taken = b.take_lease("cp-b", now=118.0, lease_s=10.0, address="cp-b:8080")
    assert taken is not None and (taken.holder, taken.term, taken.address) == ("cp-b", 2, "cp-b:8080")
    assert a.take_lease("cp-a", now=119.0, lease_s=10.0, term=1) is None  # the paused old leader wakes: refused
    assert a.take_lease("cp-a", now=119.0, lease_s=10.0) is None  # nor can it take it back while b holds it
    assert not a.release_lease("cp-a", term=1, now=119.0)
    assert b.release_lease("cp-b", term=2, now=120.0)  # a clean stop hands it over at once
    again = a.take_lease("cp-a", now=120.0, lease_s=10.0)
    assert again is not None and again.term == 3


@pytest.mark.parametrize("expired", [False, True], ids=["empty", "expired"])
def test_servers_racing_for_the_lease_leave_exactly_one_holder(opened: Callable[[], Store], expired: bool) -> None:
    """Six servers taking the lease at once (none yet, or an expired one) leave one holder and one new term."""
    stores = [opened() for _ in range(6)]
    if expired:
        assert stores[0].take_lease("old", now=0.0, lease_s=1.0) is not None
    gate = threading.Barrier(len(stores))
    won: list[object] = [None] * len(stores)

    def take(i: int) -> None:
        gate.wait()
        won[i] = stores[i].take_lease(f"cp-{i}", now=50.0, lease_s=10.0)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [w for w in won if w is not None]
    assert len(winners) == 1, won
    lease = stores[0].get_lease()
    assert lease is not None and lease.holder == winners[0].holder and lease.term == (2 if expired else 1)  # type: ignore[attr-defined]


def test_a_restarted_holder_takes_its_own_lease_back_at_once_with_a_new_term(opened: Callable[[], Store]) -> None:
    """The same instance id after a restart does not wait out its own lease, and its new term fences the old."""
    a = opened()
    first = a.take_lease("cp-a", now=100.0, lease_s=10.0)
    assert first is not None and first.term == 1
    again = opened().take_lease("cp-a", now=101.0, lease_s=10.0)
    assert again is not None and (again.holder, again.term) == ("cp-a", 2)
    assert a.take_lease("cp-a", now=102.0, lease_s=10.0, term=1) is None


def test_writes_are_fenced_by_the_lease_term(opened: Callable[[], Store]) -> None:
    """A leader writes at its term; once another took the lease its writes raise Fenced and change nothing;
    a standby writes nothing; an unfenced store (no election) writes as before."""
    a, b = opened(), opened()
    lease = a.take_lease("cp-a", now=a.db_now(), lease_s=0.5)
    assert lease is not None
    a.fence = ("cp-a", lease.term)
    a.put_settings({"k": "from-a"})
    b.fence = store_mod.STANDBY
    with pytest.raises(store_mod.Fenced, match="standby"):
        b.put_settings({"k": "from-b"})
    time.sleep(0.6)
    taken = b.take_lease("cp-b", now=b.db_now(), lease_s=10.0)
    assert taken is not None and taken.term == lease.term + 1
    b.fence = ("cp-b", taken.term)
    with pytest.raises(store_mod.Fenced, match=f"held by cp-b at term {taken.term}"):
        a.put_model(MODEL)
    assert a.get_model("m") is None and a.settings() == {"k": "from-a"}
    b.put_settings({"k": "from-b"})
    a.fence = None
    a.put_settings({"j": "unfenced"})
    assert b.settings() == {"k": "from-b", "j": "unfenced"}


def test_a_takeover_waits_for_the_old_leaders_write_in_flight(pg: Postgres) -> None:
    """On PostgreSQL the fence holds the lease row (FOR SHARE) for the write's transaction: a takeover made
    meanwhile waits until that write committed, so no write of the old term lands after the new term began."""
    url = pg.create_database(f"t{next(_db_names)}")
    a, b = Store.open_url(url), Store.open_url(url)
    try:
        lease = a.take_lease("cp-a", now=a.db_now(), lease_s=0.2)
        assert lease is not None
        a.fence = ("cp-a", lease.term)
        time.sleep(0.3)  # expired: b may take it
        order: list[str] = []
        inside = threading.Event()
        with a._tx() as s:  # the old leader's write, in flight
            s.add(SettingRow(key="late", value="old term"))
            inside.set()
            taker = threading.Thread(target=lambda: order.append(
                f"taken {b.take_lease('cp-b', now=b.db_now(), lease_s=10.0) is not None}"))
            taker.start()
            time.sleep(0.5)
            order.append("write committed")
        taker.join(10)
        assert order == ["write committed", "taken True"]
        with pytest.raises(store_mod.Fenced):
            a.put_settings({"after": "old term"})
    finally:
        a.close()
        b.close()
