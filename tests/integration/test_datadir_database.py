"""A data directory remembers its cluster's database, so a command given only ``--data-dir`` opens the right one.

Found by a careless operator: `llmgw token create --data-dir D` on a cluster whose store is PostgreSQL, without
--database, made a new SQLite file in D, wrote the token there, exited 0 and printed a join command that no
server would honour. Real PostgreSQL (``llmgw.testing.postgres``), real CLI processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from llmgw.control import datadir
from llmgw.control.store.store import Store
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import Proc, free_port
from llmgw.testing.system import LLMGW


def _llmgw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE"}
    return subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**clean, **(env or {})})


def _with_password(url: str) -> str:
    """The URL with a password in it (the harness's trust authentication takes any)."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:s3cret-pw@{host}"


def test_token_create_with_only_the_data_dir_writes_to_the_clusters_postgres(pg: Postgres, tmp_path: Path) -> None:
    """init with LLMGW_DATABASE (a password in it) remembers the URL without the password; token create and the
    server, given only --data-dir, open that PostgreSQL, and no SQLite file appears in the directory."""
    url = pg.create_database("remembered")
    data = tmp_path / "d"
    init = _llmgw("init", "--data-dir", str(data), env={"LLMGW_DATABASE": _with_password(url)})
    assert init.returncode == 0, init.stderr
    kept = datadir.database_file(data)
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert "s3cret-pw" not in kept.read_text() and json.loads(kept.read_text())["database"] == url

    made = _llmgw("token", "create", "--data-dir", str(data))
    assert made.returncode == 0, made.stderr
    token_id = made.stdout.split("--token ", 1)[1].split(".", 1)[0]
    assert not (data / "llmgw.db").exists()
    store = Store.open_url(url)
    try:
        assert store.get_token(token_id) is not None
    finally:
        store.close()

    # The server too: the administrator init made in PostgreSQL logs in to a server given only --data-dir.
    password = init.stdout.split("keep it now): ", 1)[1].split()[0]
    http = free_port()
    server = Proc.start([*LLMGW, "server", "--data-dir", str(data), "--http-port", str(http), "--agent-port",
                         str(free_port()), "--join-port", str(free_port())], log_path=tmp_path / "srv.log",
                        env={k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE"})
    try:
        server.wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60)
        login = httpx.post(f"http://127.0.0.1:{http}/api/v1/login", json={"username": "admin", "password": password},
                           timeout=30)
        assert login.status_code == 200, login.text
    finally:
        server.stop(timeout=20)
    assert not (data / "llmgw.db").exists()


def test_another_database_than_the_directorys_is_refused(pg: Postgres, tmp_path: Path) -> None:
    """--database naming another database than the one the directory belongs to is refused, saying both."""
    url, other = pg.create_database("mine"), pg.create_database("other")
    data = tmp_path / "d"
    assert _llmgw("init", "--data-dir", str(data), "--database", url).returncode == 0
    wrong = _llmgw("token", "create", "--data-dir", str(data), "--database", other)
    assert wrong.returncode == 1, wrong.stdout
    assert f"belongs to the database {url}" in wrong.stderr and "/other" in wrong.stderr, wrong.stderr
    # The same database with its password given is the same database.
    assert _llmgw("token", "create", "--data-dir", str(data), env={"LLMGW_DATABASE": _with_password(url)}
                  ).returncode == 0


def test_a_directory_that_does_not_name_its_database_is_not_guessed(pg: Postgres, tmp_path: Path) -> None:
    """Initialised for PostgreSQL before directories remembered it (no database.json, no llmgw.db): refused
    with what to give, and no SQLite file made."""
    url = pg.create_database("unnamed")
    data = tmp_path / "d"
    assert _llmgw("init", "--data-dir", str(data), "--database", url).returncode == 0
    datadir.database_file(data).unlink()
    made = _llmgw("token", "create", "--data-dir", str(data))
    assert made.returncode == 1 and "does not name" in made.stderr and "--database" in made.stderr, made.stderr
    assert not (data / "llmgw.db").exists()


def test_a_sqlite_directory_stays_sqlite(tmp_path: Path) -> None:
    """init without a database remembers SQLite; token create uses the directory's llmgw.db as before."""
    data = tmp_path / "d"
    assert _llmgw("init", "--data-dir", str(data)).returncode == 0
    assert json.loads(datadir.database_file(data).read_text())["database"] == ""
    made = _llmgw("token", "create", "--data-dir", str(data))
    assert made.returncode == 0, made.stderr
    store = Store.open(data)
    try:
        assert store.get_token(made.stdout.split("--token ", 1)[1].split(".", 1)[0]) is not None
    finally:
        store.close()
