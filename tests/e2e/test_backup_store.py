"""Backups of a real data directory and SQLite store: consistent while written, restored whole, refusals, retention.

Real files, a real store (SQLAlchemy on SQLite in WAL, written from another thread while the backup runs),
the real CLI as a process. The whole cluster (server, agent, engine) backed up and restored is
tests/e2e/test_backup_restore.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from llmgw.control import datadir
from llmgw.control import events as ev
from llmgw.control.backup import archive, schedule, sealed
from llmgw.control.store.store import Store
from llmgw.core.errors import LlmgwError
from llmgw.serving.settings import ServerSettings
from llmgw.testing.system import LLMGW

PASS = "correct horse battery staple"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    datadir.init(d, hosts=[])
    return d


def _pairs(store: Store) -> list[int]:
    """The numbers of the events written in pairs (one transaction each), asserting no pair is split."""
    got: dict[int, set[str]] = {}
    for e in store.list_events(obj="test/pair", limit=10**6):
        n, side = e.message.split(":")
        got.setdefault(int(n), set()).add(side)
    assert all(sides == {"a", "b"} for sides in got.values()), "a transaction was copied half"
    return sorted(got)


def test_sqlite_backup_is_consistent_while_another_connection_writes(data: Path, tmp_path: Path) -> None:
    store = datadir.open_store(data)
    # A database of some size, so the copy takes a while.
    store.add_events([ev.Event(time.time(), ev.NORMAL, "Filler", "test/filler", "x" * 500) for _ in range(5000)],
                     keep=10**6)
    written = [0]
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            n = written[0] + 1
            store.add_events([ev.Event(time.time(), ev.NORMAL, "Pair", "test/pair", f"{n}:{side}")
                              for side in "ab"], keep=10**6)
            written[0] = n

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while written[0] < 20:
            time.sleep(0.01)
        before = written[0]
        made = archive.make(tmp_path / "b.llmgwbak", PASS, data_dir=data)
        during = written[0] - before
    finally:
        stop.set()
        thread.join()
    assert during > 0, "the writer was held up for the whole backup"
    store.close()
    assert made.kind == "sqlite" and stat.S_IMODE(made.path.stat().st_mode) == 0o600

    new = tmp_path / "restored"
    done = archive.restore(made.path, PASS, data_dir=new)
    assert done.ca_hash == made.ca_hash
    restored = datadir.open_store(new)
    try:
        pairs = _pairs(restored)
        assert pairs == list(range(1, len(pairs) + 1)) and before <= len(pairs) <= written[0]
        assert [u.name for u in restored.list_users()] == ["admin"]
    finally:
        restored.close()
    assert (new / "pki" / "ca.key").read_bytes() == (data / "pki" / "ca.key").read_bytes()
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((new / "pki" / key).stat().st_mode) == 0o600
    assert stat.S_IMODE(new.stat().st_mode) == 0o700
    assert datadir.remembered_database(new) == ""
    assert not (new / "instance-id").exists()  # a new instance of the same cluster
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary directory left


def test_restore_refuses_and_writes_nothing(data: Path, tmp_path: Path) -> None:
    made = archive.make(tmp_path / "b", PASS, data_dir=data)
    target = tmp_path / "new"
    with pytest.raises(sealed.BackupRefused, match="wrong passphrase"):
        archive.restore(made.path, "a wrong passphrase", data_dir=target)
    with pytest.raises(LlmgwError, match="SQLite store.*leave --database"):
        archive.restore(made.path, PASS, data_dir=target, database="postgresql+psycopg://u@127.0.0.1:1/x")
    raw = made.path.read_bytes()
    (tmp_path / "cut").write_bytes(raw[:-30])
    with pytest.raises(sealed.BackupRefused, match="cut short"):
        archive.restore(tmp_path / "cut", PASS, data_dir=target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "cut", "data"]  # no target, no staging left
    target.mkdir()
    (target / "llmgw.db").write_bytes(b"someone's")
    with pytest.raises(LlmgwError, match="is not empty; nothing was written"):
        archive.restore(made.path, PASS, data_dir=target)
    assert [p.name for p in target.iterdir()] == ["llmgw.db"]


def test_backup_refuses_to_write_into_the_data_directory_or_over_a_file(data: Path, tmp_path: Path) -> None:
    with pytest.raises(LlmgwError, match="inside the data directory"):
        archive.make(data / "b", PASS, data_dir=data)
    (tmp_path / "b").write_bytes(b"kept")
    with pytest.raises(LlmgwError, match="exists; nothing was written"):
        archive.make(tmp_path / "b", PASS, data_dir=data)
    assert (tmp_path / "b").read_bytes() == b"kept"
    with pytest.raises(LlmgwError, match="not an initialised"):
        archive.make(tmp_path / "c", PASS, data_dir=tmp_path / "nothing")


def test_usage_journal_and_initial_password_travel_other_files_do_not(data: Path, tmp_path: Path) -> None:
    (data / "usage-journal").mkdir()
    (data / "usage-journal" / "j1-1.jsonl").write_text('{"seq": 1}\n')
    datadir.write_private(data / datadir.INITIAL_PASSWORD, b"pw\n")
    (data / "logs").mkdir()
    (data / "logs" / "server.log").write_text("log")
    (data / "instance-id").write_text("host-1234\n")
    made = archive.make(tmp_path / "b", PASS, data_dir=data)
    archive.restore(made.path, PASS, data_dir=tmp_path / "new")
    got = sorted(p.relative_to(tmp_path / "new").as_posix() for p in (tmp_path / "new").rglob("*") if p.is_file())
    assert got == ["database.json", "initial-admin-password", "llmgw.db", "pki/ca.crt", "pki/ca.key",
                   "pki/server.crt", "pki/server.key", "usage-journal/j1-1.jsonl"]
    assert stat.S_IMODE((tmp_path / "new" / datadir.INITIAL_PASSWORD).stat().st_mode) == 0o600


def test_retention_deletes_only_scheduled_backups(data: Path, tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    plan = schedule.Schedule(dir=backups, every_s=3600, keep=2, passphrase=PASS)
    made = [schedule.run_once(plan, data_dir=data, database="", now=1_800_000_000 + i) for i in range(3)]
    # Not ours: our name but not a backup; a backup under another name; an operator's file.
    (backups / schedule.file_name(1_700_000_000)).write_bytes(b"not a backup at all")
    assert not made[0].path.exists() and schedule.ours(backups) == [made[1].path, made[2].path]
    (backups / "keep-me.llmgwbak").write_bytes(made[1].path.read_bytes())
    (backups / "notes.txt").write_text("mine")
    last = schedule.run_once(plan, data_dir=data, database="", now=1_800_000_100)
    names = sorted(p.name for p in backups.iterdir())
    assert names == sorted([schedule.file_name(1_700_000_000), "keep-me.llmgwbak", "notes.txt",
                            made[2].path.name, last.path.name])
    assert schedule.ours(backups) == [made[2].path, last.path]
    assert schedule.due_at(plan) == pytest.approx(last.path.stat().st_mtime + 3600)
    archive.restore(last.path, PASS, data_dir=tmp_path / "new")  # what the schedule writes restores


def _llmgw(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("LLMGW_DATABASE", "LLMGW_BACKUP_PASSPHRASE")}
    return subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**clean, **env})


def test_cli_backup_and_restore(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.llmgwbak"
    no_pass = _llmgw("backup", str(out), "--data-dir", str(data), env={})
    assert no_pass.returncode == 1 and "set LLMGW_BACKUP_PASSPHRASE" in no_pass.stderr and not out.exists()
    loose = tmp_path / "pass"
    loose.write_text(PASS + "\n")
    loose.chmod(0o644)
    refused = _llmgw("backup", str(out), "--data-dir", str(data), "--passphrase-file", str(loose), env={})
    assert refused.returncode == 1 and "chmod 600" in refused.stderr and not out.exists()
    loose.chmod(0o600)
    ok = _llmgw("backup", str(out), "--data-dir", str(data), "--passphrase-file", str(loose), env={})
    assert ok.returncode == 0, ok.stderr
    assert PASS not in ok.stdout + ok.stderr and stat.S_IMODE(out.stat().st_mode) == 0o600
    wrong = _llmgw("restore", str(out), "--data-dir", str(tmp_path / "new"),
                   env={"LLMGW_BACKUP_PASSPHRASE": "not the right one"})
    assert wrong.returncode == 1 and "wrong passphrase" in wrong.stderr and not (tmp_path / "new").exists()
    back = _llmgw("restore", str(out), "--data-dir", str(tmp_path / "new"), env={"LLMGW_BACKUP_PASSPHRASE": PASS})
    assert back.returncode == 0, back.stderr
    assert "llmgw server --data-dir" in back.stdout and (tmp_path / "new" / "pki" / "ca.key").exists()


def test_schedule_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="--backup-dir and --backup-passphrase-file go together"):
        ServerSettings(backup_dir=Path("/tmp/x"))
    with pytest.raises(ValueError, match="--backup-every"):
        ServerSettings(backup_every="0s")


def test_a_sqlite_database_url_is_backed_up_as_sqlite(tmp_path: Path) -> None:
    """`llmgw server --database sqlite:///elsewhere.db`: the copy is SQLite's, restored into the data directory."""
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    data = tmp_path / "data"
    datadir.init(data, hosts=[], database=url)
    made = archive.make(tmp_path / "b", PASS, data_dir=data)
    assert made.kind == "sqlite"
    archive.restore(made.path, PASS, data_dir=tmp_path / "new")
    restored = datadir.open_store(tmp_path / "new")
    try:
        assert [u.name for u in restored.list_users()] == ["admin"]
    finally:
        restored.close()


def test_scheduled_backups_need_a_secure_server() -> None:
    with pytest.raises(ValueError, match="--backup-dir with --insecure"):
        ServerSettings(backup_dir=Path("/tmp/x"), backup_passphrase_file=Path("/tmp/p"), insecure=True)


def _run_until(plan: schedule.Schedule, data: Path, leading: object, want: str) -> list[ev.Event]:
    """``schedule.run`` until it records an event of reason ``want``; the events it recorded."""
    import asyncio

    got: list[ev.Event] = []

    async def main() -> None:
        seen = asyncio.Event()

        def record(e: ev.Event) -> None:
            got.append(e)
            if e.reason == want:
                seen.set()

        task = asyncio.create_task(schedule.run(plan, data_dir=data, database="", leading=leading,  # type: ignore[arg-type]
                                                record=record, poll_s=0.01))
        try:
            await asyncio.wait_for(seen.wait(), 60)
        finally:
            task.cancel()

    asyncio.run(main())
    return got


def test_only_the_leader_backs_up(data: Path, tmp_path: Path) -> None:
    plan = schedule.Schedule(dir=tmp_path / "backups", every_s=3600, keep=2, passphrase=PASS)
    asked: list[int] = []

    def leading() -> bool:
        asked.append(len(schedule.ours(plan.dir)))  # how many backups there were each time it asked
        return len(asked) > 3  # a standby for the first three looks, then the leader

    got = _run_until(plan, data, leading, "BackupWritten")
    assert asked[:3] == [0, 0, 0], "a standby wrote a backup"
    assert [e.reason for e in got] == ["BackupWritten"] and got[0].object == "cluster/backup"
    assert len(schedule.ours(plan.dir)) == 1 and schedule.ours(plan.dir)[0].name in got[0].message


def test_a_failed_scheduled_backup_is_an_event_with_the_sentence(tmp_path: Path) -> None:
    plan = schedule.Schedule(dir=tmp_path / "backups", every_s=3600, keep=2, passphrase=PASS)
    before = schedule.FAILURES._value.get()
    got = _run_until(plan, tmp_path / "not-a-data-dir", lambda: True, "BackupFailed")
    assert got[0].kind == ev.WARNING and "not an initialised control plane data directory" in got[0].message
    assert schedule.FAILURES._value.get() == before + 1
    assert schedule.ours(plan.dir) == []


def _crafted(path: Path, members: list[tuple[str, bytes, bytes]]) -> None:
    """A sealed file holding a tar of ``(name, type, data)`` members, as a hostile or broken writer makes one."""
    import gzip
    import io
    import json
    import tarfile

    manifest = json.dumps({"format": archive.FORMAT, "database": "sqlite", "ca_hash": "x"}).encode()
    with sealed.SealedWriter(path, PASS, log_n=10) as w, gzip.GzipFile(fileobj=w, mode="wb") as gz, \
            tarfile.open(fileobj=gz, mode="w|") as tar:
        for name, kind, data in [(archive.MANIFEST, tarfile.REGTYPE, manifest), *members]:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
            info.linkname = data.decode() if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize("member", [("data/../../escaped", b"0", b"x"), ("/etc/evil", b"0", b"x"),
                                    ("data/pki/ca.key", b"2", b"/etc/shadow"), ("data/logs/x", b"0", b"x")])
def test_restore_takes_only_the_files_a_backup_holds(tmp_path: Path, member: tuple[str, bytes, bytes]) -> None:
    _crafted(tmp_path / "b", [member])
    with pytest.raises(sealed.BackupRefused, match="which no llmgw backup holds; nothing|not a file; nothing"):
        archive.restore(tmp_path / "b", PASS, data_dir=tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert not (tmp_path.parent / "escaped").exists()


def test_restore_into_an_empty_directory(data: Path, tmp_path: Path) -> None:
    made = archive.make(tmp_path / "b", PASS, data_dir=data)
    (tmp_path / "empty").mkdir()
    archive.restore(made.path, PASS, data_dir=tmp_path / "empty")
    assert (tmp_path / "empty" / "pki" / "ca.key").is_file()


def test_a_restored_store_has_no_leader_and_the_next_takes_a_higher_term(data: Path, tmp_path: Path) -> None:
    """The backup of a running leader holds its lease; the restored copy must not keep the restored server a
    standby (503) until that lease runs out: the lease is ended, and whoever takes it gets a higher term."""
    store = datadir.open_store(data)
    try:
        taken = store.take_lease("old-leader", now=store.db_now(), lease_s=3600.0)
        assert taken is not None
    finally:
        store.close()
    made = archive.make(tmp_path / "b", PASS, data_dir=data)
    archive.restore(made.path, PASS, data_dir=tmp_path / "new")
    restored = datadir.open_store(tmp_path / "new")
    try:
        again = restored.take_lease("new-leader", now=restored.db_now(), lease_s=6.0)
        assert again is not None and again.term == taken.term + 1
    finally:
        restored.close()
