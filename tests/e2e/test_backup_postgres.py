"""A PostgreSQL cluster's backup (pg_dump) restored into a fresh database of a real PostgreSQL, and served from.

Real PostgreSQL (``llmgw.testing.postgres``), the real CLI and `llmgw server` as processes. The URL carries a
password (the test server trusts any): it must reach pg_dump and pg_restore only through their environment.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.control import datadir
from llmgw.control.backup import database as db_copy
from llmgw.control.store.store import StoredUser
from llmgw.testing.postgres import Postgres
from llmgw.testing.system import LLMGW, System

PASS = "a long passphrase for the test"
SECRET = "pg-sekrit-pw"


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    with Postgres() as server:
        yield server


def _with_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{SECRET}@{host}"


def _llmgw(*args: str, database: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE"}
    return subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**env, "LLMGW_BACKUP_PASSPHRASE": PASS, **({"LLMGW_DATABASE": database}
                                                                          if database else {})})


def test_libpq_connection_carries_no_password_on_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_BACKUP_PASSPHRASE", PASS)
    conninfo, env = db_copy.libpq(f"postgresql+psycopg://u:{SECRET}@db.example:5433/llmgw?sslmode=require")
    assert SECRET not in conninfo and "sslmode=require" in conninfo and "port=5433" in conninfo
    assert env["PGPASSWORD"] == SECRET
    assert PASS not in env.values()  # the backup's passphrase never reaches pg_dump


def test_postgres_backup_restores_into_a_fresh_database_and_serves(pg: Postgres, tmp_path: Path) -> None:
    source = _with_password(pg.create_database("backup_src"))
    data = tmp_path / "data"
    done = datadir.init(data, hosts=[], database=source)
    store = datadir.open_store(data, source)
    try:
        store.put_user(StoredUser("pat", "viewer", "x", time.time()))
    finally:
        store.close()

    backup = tmp_path / "pg.llmgwbak"
    made = _llmgw("backup", str(backup), "--data-dir", str(data), database=source)
    assert made.returncode == 0, made.stderr
    assert "postgresql store" in made.stdout and SECRET not in made.stdout + made.stderr

    new = tmp_path / "new" / "data"
    refused = _llmgw("restore", str(backup), "--data-dir", str(new))
    assert refused.returncode == 1 and "give --database URL" in refused.stderr and not new.exists()
    refused = _llmgw("restore", str(backup), "--data-dir", str(new), database=source)  # not empty
    assert refused.returncode == 1 and "holds tables already" in refused.stderr and not new.exists()

    target = _with_password(pg.create_database("backup_dst"))
    restored = _llmgw("restore", str(backup), "--data-dir", str(new), database=target)
    assert restored.returncode == 0, restored.stderr
    assert SECRET not in restored.stdout + restored.stderr
    assert datadir.remembered_database(new) == datadir.without_password(target)
    assert SECRET not in (new / datadir.DATABASE_FILE).read_text()
    assert not (new / datadir.DB).exists() and not list(new.glob("*.pgdump")) and not list(new.glob(".restore*"))

    # The restored directory and database are the cluster: the server starts on them, admin's password works.
    system = System(tmp_path / "served", database=target)
    system.data_dir, system.admin_password = new, done.admin_password
    try:
        system.start_server()
        assert {"admin", "pat"} <= {u["name"] for u in system.get("/api/v1/users")["items"]}
    finally:
        system.close()
