"""Projects in the store on PostgreSQL as on SQLite (issue 26): the upgrade from 0013 moves a key into
``default``, members and limits round-trip, a project with keys and ``default`` are not deleted."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from llmgw.control.loop.table import build_endpoints_doc
from llmgw.control.store import store as store_mod
from llmgw.control.store.store import ProjectRefused, Store, StoredKey, StoredUser
from llmgw.core import quota
from llmgw.router.auth import Authenticator
from llmgw.testing.postgres import Postgres

_names = itertools.count(1)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return store_mod.sqlite_url(tmp_path)
    server: Postgres = request.getfixturevalue("pg")
    return server.create_database(f"p{next(_names)}")


def test_upgrade_from_0013_and_projects_round_trip(url: str) -> None:
    """A key written at 0013 is in `default` after the upgrade and authenticates; projects work the same."""
    engine = sa.create_engine(url)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(ROOT / "llmgw/control/store/migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        alembic_command.upgrade(cfg, "0013")
        conn.execute(sa.text("insert into api_keys (id, name, sha256, models, rpm, tpm, priority, created_at, "
                             "disabled, last_used_at) values ('key-old', 'old', :h, '[]', 0, 0, 0, 1.0, false, 0)"),
                     {"h": hashlib.sha256(b"llmgw-s").hexdigest()})
    engine.dispose()
    store = Store.open_url(url)
    try:
        (key,) = store.list_keys()
        assert (key.project, key.user, key.limits) == ("default", "", quota.Limits())
        found = Authenticator.from_doc(build_endpoints_doc(store, 0.0).auth).identify(b"Bearer llmgw-s")
        assert getattr(found, "project", None) == "default"

        store.put_user(StoredUser("bob", "viewer", "x", 1.0))
        store.create_project("team", now=1.0)
        store.put_member("team", "bob", "member")
        store.set_project_limits("team", quota.Limits(tokens_per_day=20_000, spend_per_month=12.5))
        store.add_key(StoredKey("key-new", "n", "cd" * 32, created_at=2.0, project="team", user="bob",
                                limits=quota.Limits(requests_per_day=100)))
        got = store.get_project("team")
        assert got is not None and (got.members, got.keys) == ((("bob", "member"),), 1)
        assert got.limits == quota.Limits(tokens_per_day=20_000, spend_per_month=12.5)
        assert store.project_roles_of("bob") == {"team": "member"}
        assert store.get_key("key-new") == StoredKey("key-new", "n", "cd" * 32, created_at=2.0, project="team",
                                                     user="bob", limits=quota.Limits(requests_per_day=100))
        with pytest.raises(ProjectRefused, match="still has 1 key"):
            store.delete_project("team")
        with pytest.raises(ProjectRefused, match="cannot be deleted"):
            store.delete_project("default")
    finally:
        store.close()
