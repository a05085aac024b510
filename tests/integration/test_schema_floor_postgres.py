"""The schema floor on a real PostgreSQL (issue 29): a newer release's expanded schema is run beside, a
contracted one refused with nothing changed, and the check waits on the migration lock like the upgrade."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from llmgw.control.store.base import MIGRATION_LOCK_KEY
from llmgw.control.store.schemafloor import SchemaTooNew
from llmgw.control.store.store import Store, StoredUser
from llmgw.core import specs
from llmgw.core.version import version
from llmgw.testing import migrations
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import wait_for

_names = itertools.count(1)


def model(name: str) -> specs.Model:
    return specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
                                 "spec": {"engine": "sim"}})


def test_an_expanded_newer_schema_is_run_beside(pg: Postgres, tmp_path: Path) -> None:
    url = pg.create_database(f"floor{next(_names)}")
    newer_migrations = migrations.newer(tmp_path, migrations.EXPAND, floor="0015")
    newer = Store.open_url(url, migrations=newer_migrations)
    this = Store.open_url(url)  # while the newer one is open, as two control planes are
    try:
        newer.put_model(model("from-newer"))
        assert [m.model.name for m in this.list_models()] == ["from-newer"]
        this.put_model(model("from-this"))
        this.put_user(StoredUser("ops", "viewer", "h", 1.0))
        assert [m.model.name for m in newer.list_models()] == ["from-newer", "from-this"]
        assert [u.name for u in newer.list_users()] == ["ops"]
        with this.engine.connect() as c:
            assert c.execute(sa.text("select version_num from alembic_version")).scalar_one() == "0017"
    finally:
        this.close()
        newer.close()


def test_a_contracted_newer_schema_is_refused_and_left_as_it_was(pg: Postgres, tmp_path: Path) -> None:
    url = pg.create_database(f"floor{next(_names)}")
    Store.open_url(url, migrations=migrations.newer(tmp_path, migrations.CONTRACT, floor="0017")).close()
    migrations.set_writer(url, "0.3.0")
    before = migrations.snapshot(url)
    with pytest.raises(SchemaTooNew, match=r"^the database's schema is at 0017, written by llmgw 0\.3\.0, which no "
                                           r"release before schema 0017 may run against; this llmgw "):
        Store.open_url(url)
    assert migrations.snapshot(url) == before


#: This release's server start, as a process of its own (Alembic's context is not thread-safe).
_OPEN = """
import sys
from llmgw.control.store.schemafloor import SchemaTooNew
from llmgw.control.store.store import Store
try:
    Store.open_url(sys.argv[1]).close()
except SchemaTooNew as e:
    print("refused:", e)
    sys.exit(3)
print("opened")
"""


def test_the_check_waits_for_a_newer_release_migrating_under_the_lock(pg: Postgres, tmp_path: Path) -> None:
    """A newer release holds the migration lock, contracting the schema, when this release starts: this one
    waits on the lock rather than read the revision before the commit, then refuses what it finds."""
    url = pg.create_database(f"floor{next(_names)}")
    Store.open_url(url).close()  # this release's schema, 0016
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations.newer(tmp_path, migrations.CONTRACT, floor="0017")))
    engine = sa.create_engine(url)
    proc: subprocess.Popen[str] | None = None
    try:
        with engine.connect() as conn:
            tx = conn.begin()
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            cfg.attributes["connection"] = conn
            alembic_command.upgrade(cfg, "head")
            conn.execute(sa.text("UPDATE settings SET value = '0017' WHERE key = 'schema_floor'"))
            proc = subprocess.Popen([sys.executable, "-c", _OPEN, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
            with engine.connect() as watcher:
                wait_for(lambda: watcher.execute(sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).scalar_one(),
                    timeout=30, what="this release's start waiting on the migration lock")
            assert proc.poll() is None
            tx.commit()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        engine.dispose()
    assert proc.returncode == 3, err[-2000:]
    assert out.startswith(f"refused: the database's schema is at 0017, written by llmgw {version()}, which no release "
                          "before schema 0017 may run against")
