"""``llmgw server`` (a real process) against a newer release's schema (issue 29): an expanded one is run beside
with a warning, a contracted one refused at start with one sentence and a non-zero exit, the database unchanged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import sqlalchemy as sa

from llmgw.control.store.base import sqlite_url
from llmgw.control.store.store import Store
from llmgw.core.version import version
from llmgw.testing import migrations
from llmgw.testing.system import LLMGW, System, sim_model


def newer_database(root: Path, body: str, floor: str) -> tuple[System, Path, str]:
    """An initialised data directory whose SQLite database a newer release (0.3.0, with a synthetic 0017)
    migrated; the system (not started), that release's migrations and the database's URL."""
    s = System(root)
    s._init()  # this release's init: the CA, the admin, the schema at 0016
    newer = migrations.newer(root, body, floor=floor)
    Store.open(s.data_dir, migrations=newer).close()
    url = sqlite_url(s.data_dir)
    migrations.set_writer(url, "0.3.0")
    return s, newer, url


def test_a_contracted_newer_schema_stops_the_server_with_one_sentence(tmp_path: Path) -> None:
    s, _, url = newer_database(tmp_path, migrations.CONTRACT, "0017")
    before = migrations.snapshot(url)
    ports = tmp_path / "ports.json"
    done = subprocess.run([*LLMGW, "server", "--data-dir", str(s.data_dir), "--http-port", "0", "--agent-port", "0",
                           "--join-port", "0", "--ports-file", str(ports)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: the database's schema is at 0017, written by llmgw 0.3.0, which no release before schema 0017 may "
        f"run against; this llmgw {version()} knows schema up to 0016: run llmgw 0.3.0 or newer, or restore a "
        "backup taken before the upgrade (`llmgw restore`)"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not ports.exists()  # nothing listened
    assert migrations.snapshot(url) == before


def test_an_expanded_newer_schema_is_served_beside_with_a_warning(tmp_path: Path) -> None:
    s, newer, url = newer_database(tmp_path, migrations.EXPAND, "0015")
    try:
        s.start_server()
        log = (tmp_path / "server.log").read_text(errors="replace")
        assert (f"WARNING llmgw.control.store.base: the database's schema is at 0017, written by llmgw 0.3.0, "
                f"newer than this llmgw {version()} knows (up to 0016); its floor 0015 lets this release run beside "
                "the newer one") in log
        s.apply(sim_model("beside"))
        assert [m["metadata"]["name"] for m in s.get("/api/v1/models")["items"]] == ["beside"]
    finally:
        s.close()
    store = Store.open(s.data_dir, migrations=newer)  # the newer release reads what this one wrote
    try:
        assert [m.model.name for m in store.list_models()] == ["beside"]
        with store.engine.connect() as c:
            assert c.execute(sa.text("select version_num from alembic_version")).scalar_one() == "0017"
    finally:
        store.close()
