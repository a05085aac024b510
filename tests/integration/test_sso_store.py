"""Single sign-on's store on SQLite and on PostgreSQL (several control planes share one in HA): the upgrade from
0014 keeps users local, a begun sign-in is taken once (two control planes racing for one state: one wins), and
an SSO user's sign-in, its name's guard and its sign-out."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from llmgw.control.store import store as store_mod
from llmgw.control.store.store import SsoNameTaken, Store, StoredApiToken, StoredUser
from llmgw.testing.postgres import Postgres

_names = itertools.count(1)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return store_mod.sqlite_url(tmp_path)
    server: Postgres = request.getfixturevalue("pg")
    return server.create_database(f"sso{next(_names)}")


def test_upgrade_from_0014_keeps_users_local(url: str) -> None:
    engine = sa.create_engine(url)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(ROOT / "llmgw/control/store/migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        alembic_command.upgrade(cfg, "0014")
        conn.execute(sa.text("insert into users (name, role, password_hash, created_at) values "
                             "('old', 'admin', 'h', 1.0)"))
    engine.dispose()
    store = Store.open_url(url)
    try:
        user = store.get_user("old")
        assert user is not None and user.source == "local" and user.role == "admin"
    finally:
        store.close()


def test_a_begun_sign_in_is_taken_once_under_a_race(url: str) -> None:
    stores = [Store.open_url(url) for _ in range(2)]  # two control planes on one database
    try:
        for i in range(10):
            stores[0].put_sso_pending(f"s{i}", kind="code", data={"nonce": f"n{i}"}, expires_at=1e12)
        got: list[object] = []
        def take(store: Store) -> None:
            for i in range(10):
                got.append(store.take_sso_pending(f"s{i}", kind="code", now=1.0))
        threads = [threading.Thread(target=take, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [g for g in got if g is not None]
        assert len(got) == 20 and sorted(w["nonce"] for w in won) == sorted(f"n{i}" for i in range(10))  # type: ignore[index]
        stores[0].put_sso_pending("late", kind="code", data={}, expires_at=5.0)
        assert stores[1].take_sso_pending("late", kind="code", now=6.0) is None  # expired
        stores[0].put_sso_pending("dev", kind="device", data={"device_code": "d"}, expires_at=10.0)
        assert stores[1].take_sso_pending("dev", kind="code", now=1.0) is None  # another kind's
        assert stores[1].get_sso_pending("dev", kind="device", now=1.0) == {"device_code": "d"}
        assert stores[0].prune_sso_pending(now=11.0) == 1
    finally:
        for s in stores:
            s.close()


def test_sso_user_sign_in_guard_and_sign_out(url: str) -> None:
    store = Store.open_url(url)
    try:
        store.put_user(StoredUser("local", "admin", "h", 1.0))
        with pytest.raises(SsoNameTaken, match="a local user named 'local' exists"):
            store.sso_sign_in(user="local", role="admin", projects={}, subject="iss|x", refresh_token="",
                              groups=(), now=1.0)
        store.create_project("p1", now=1.0)
        missing = store.sso_sign_in(user="eve", role="viewer", projects={"p1": "member", "gone": "owner"},
                                    subject="iss|eve", refresh_token="sealed", groups=("g",), now=2.0)
        assert missing == ["gone"]
        eve = store.get_user("eve")
        assert eve is not None and eve.source == "sso" and eve.role == "viewer"
        assert store.project_roles_of("eve") == {"p1": "member"}
        with pytest.raises(SsoNameTaken, match="another provider account"):
            store.sso_sign_in(user="eve", role="admin", projects={}, subject="iss|other", refresh_token="",
                              groups=(), now=3.0)
        store.sso_sign_in(user="eve", role="operator", projects={}, subject="iss|eve", refresh_token="s2",
                          groups=("h",), now=4.0)
        link = store.get_sso_link("eve")
        assert link is not None and link.refresh_token == "s2" and link.groups == ("h",) and link.refreshed_at == 4.0
        assert store.project_roles_of("eve") == {} and store.get_user("eve").role == "operator"  # type: ignore[union-attr]
        store.add_api_token(StoredApiToken("t1", "x", "user", "eve", 1.0))
        store.add_api_token(StoredApiToken("t2", "x", "session", "eve", 1.0))
        assert store.sso_sign_out("eve") == 2
        assert store.get_sso_link("eve") is None and store.list_api_tokens(subject="eve") == []
    finally:
        store.close()
