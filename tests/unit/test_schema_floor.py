"""The schema floor at start (issue 29): a newer release's schema is run beside when its floor allows, refused
with a sentence and left exactly as it was when not; on real SQLite files, with synthetic newer migrations."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig

from llmgw.control.store import schemafloor
from llmgw.control.store.base import MIGRATIONS
from llmgw.control.store.schemafloor import Action, Chain, Migration, SchemaTooNew, decide, record
from llmgw.control.store.store import Store, StoredUser
from llmgw.core import specs
from llmgw.core.version import version
from llmgw.testing import migrations

CHAIN = Chain(tuple(Migration(f"{i:04d}", f"{i:04d}") for i in range(1, 16)))


def model(name: str) -> specs.Model:
    return specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
                                 "spec": {"engine": "sim"}})


def rows(url: str) -> dict[str, str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return {k: v for k, v in c.execute(sa.text("select key, value from settings"))}
    finally:
        engine.dispose()


def revision(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return str(c.execute(sa.text("select version_num from alembic_version")).scalar_one())
    finally:
        engine.dispose()


# -- the decision, on plain data ------------------------------------------------------------------------------
def test_a_revision_this_code_knows_or_none_is_upgraded() -> None:
    assert decide(CHAIN, None, {}, "0.2.0").action is Action.UPGRADE
    assert decide(CHAIN, "0009", {}, "0.2.0").action is Action.UPGRADE
    assert decide(CHAIN, "0015", {"schema_floor": "0099"}, "0.2.0").action is Action.UPGRADE


def test_a_newer_schema_above_this_codes_head_is_refused_in_one_sentence() -> None:
    verdict = decide(CHAIN, "0017", {"schema_floor": "0016", "schema_written_by": "0.3.0"}, "0.2.0")
    assert verdict.action is Action.REFUSE
    assert verdict.message == (
        "the database's schema is at 0017, written by llmgw 0.3.0, which no release before schema 0016 may run "
        "against; this llmgw 0.2.0 knows schema up to 0015: run llmgw 0.3.0 or newer, or restore a backup taken "
        "before the upgrade (`llmgw restore`)")


def test_a_newer_schema_whose_floor_this_code_reaches_is_run_beside() -> None:
    verdict = decide(CHAIN, "0016", {"schema_floor": "0015", "schema_written_by": "0.3.0"}, "0.2.0")
    assert verdict.action is Action.BESIDE
    assert verdict.message.startswith("the database's schema is at 0016, written by llmgw 0.3.0, newer than this "
                                      "llmgw 0.2.0 knows (up to 0015); its floor 0015 lets this release run beside")
    # A floor well below this head too (an old expand-only line).
    assert decide(CHAIN, "0030", {"schema_floor": "0012"}, "0.2.0").action is Action.BESIDE


def test_a_newer_schema_with_no_recorded_floor_is_refused() -> None:
    verdict = decide(CHAIN, "0016", {"schema_written_by": "0.3.0"}, "0.2.0")
    assert verdict.action is Action.REFUSE
    assert "records no schema floor" in verdict.message
    assert "this llmgw 0.2.0 knows schema up to 0015" in verdict.message
    assert "llmgw restore" in decide(CHAIN, "0016", {}, "0.2.0").message


def test_what_is_recorded_after_an_upgrade() -> None:
    head = {"schema_floor": "0015", "schema_written_by": "0.2.0"}
    assert record(CHAIN, None, {}, "0.2.0") == head  # a new database
    assert record(CHAIN, "0015", {}, "0.2.0") == head  # 0.1.0's schema: nothing recorded before
    assert record(CHAIN, "0015", head, "0.2.0") == {}  # every later start: no write
    assert record(CHAIN, "0015", head, "0.2.1") == {}  # a patch release at the same head: who migrated stays
    assert record(CHAIN, "0014", {"schema_floor": "0014", "schema_written_by": "0.1.9"}, "0.2.0") == head


# -- on SQLite, through Store ---------------------------------------------------------------------------------
def test_a_new_database_records_its_floor_and_writer(tmp_path: Path) -> None:
    Store.open(tmp_path).close()
    assert {k: v for k, v in rows(f"sqlite:///{tmp_path / 'llmgw.db'}").items() if k.startswith("schema_")} == {
        "schema_floor": "0015", "schema_written_by": version()}


def test_0_1_0s_schema_gets_the_record_at_the_first_start(tmp_path: Path) -> None:
    """A database 0.1.0 migrated (head 0015, no record): opening it upgrades nothing and records the floor."""
    url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    engine = sa.create_engine(url)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        alembic_command.upgrade(cfg, "head")
        conn.execute(sa.text("insert into settings (key, value) values ('engine_index_url', 'http://idx')"))
    engine.dispose()
    store = Store.open_url(url)
    try:
        assert store.settings() == {"engine_index_url": "http://idx"}  # the record is the migrations', not engines'
    finally:
        store.close()
    assert rows(url) == {"engine_index_url": "http://idx", "schema_floor": "0015", "schema_written_by": version()}


def test_an_expanded_newer_schema_is_read_and_written_beside_the_newer_release(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A newer release added an expanding 0017 (floor 0015): this release starts without migrating, warns, and
    reads and writes; the newer release reads what this one wrote; the revision and the record stay the newer's."""
    url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    newer_migrations = migrations.newer(tmp_path, migrations.EXPAND, floor="0015")
    newer = Store.open_url(url, migrations=newer_migrations)
    newer.put_model(model("from-newer"))
    newer.close()
    migrations.set_writer(url, "0.3.0")
    with caplog.at_level(logging.WARNING, logger="llmgw.control.store.base"):
        this = Store.open_url(url)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        schemafloor.decide(schemafloor.load_chain(MIGRATIONS), "0017",
                           {"schema_floor": "0015", "schema_written_by": "0.3.0"}, version()).message]
    assert "written by llmgw 0.3.0" in caplog.text and f"this llmgw {version()}" in caplog.text
    try:
        assert [m.model.name for m in this.list_models()] == ["from-newer"]
        this.put_model(model("from-this"))
        this.put_user(StoredUser("ops", "viewer", "h", 1.0))
    finally:
        this.close()
    assert revision(url) == "0017"
    assert rows(url)["schema_written_by"] == "0.3.0" and rows(url)["schema_floor"] == "0015"
    newer = Store.open_url(url, migrations=newer_migrations)
    try:
        assert [m.model.name for m in newer.list_models()] == ["from-newer", "from-this"]
        assert [u.name for u in newer.list_users()] == ["ops"]
        with newer.engine.connect() as c:  # the newer release's column, NULL in the row the older one wrote
            assert c.execute(sa.text("select future_note from models where name = 'from-this'")).all() == [(None,)]
    finally:
        newer.close()


def test_a_contracted_newer_schema_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    Store.open_url(url, migrations=migrations.newer(tmp_path, migrations.CONTRACT, floor="0017")).close()
    migrations.set_writer(url, "0.3.0")
    before = migrations.snapshot(url)
    with pytest.raises(SchemaTooNew) as refused:
        Store.open_url(url)
    assert str(refused.value) == (
        f"the database's schema is at 0017, written by llmgw 0.3.0, which no release before schema 0017 may run "
        f"against; this llmgw {version()} knows schema up to 0016: run llmgw 0.3.0 or newer, or restore a backup "
        "taken before the upgrade (`llmgw restore`)")
    assert migrations.snapshot(url) == before
    assert revision(url) == "0017"


def test_an_unknown_revision_without_a_record_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    Store.open_url(url, migrations=migrations.newer(tmp_path, migrations.EXPAND, floor="0015")).close()
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("delete from settings where key like 'schema_%'"))
    engine.dispose()
    before = migrations.snapshot(url)
    with pytest.raises(SchemaTooNew, match="records no schema floor"):
        Store.open_url(url)
    assert migrations.snapshot(url) == before
