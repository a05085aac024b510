"""Scheduled backups: ``llmgw server --backup-dir DIR --backup-every 6h --backup-keep N --backup-passphrase-file F``.

Only the leader backs up (several control planes on one PostgreSQL database make one backup, not one each;
a standby that takes over carries on). A backup is due ``every`` after the newest one in the directory, so
a server restarted more often than that still backs up on time, and one whose last backup is old backs up
as soon as it leads. Each is written as ``llmgw backup`` writes one (0600, atomically), named
``llmgw-backup-<UTC time>.llmgwbak``; then all but the ``keep`` newest are deleted. Retention deletes only
what a scheduled backup wrote: a file whose name has that exact pattern *and* that starts with a backup's
magic. Anything else in the directory (an operator's own copy, a renamed file) is never touched.

A backup's outcome is an event on ``cluster/backup`` (``BackupWritten``, or ``BackupFailed`` with the
sentence, also logged) and metrics on ``/metrics``: ``llmgw_backup_last_success_timestamp_seconds``,
``llmgw_backup_last_size_bytes`` and ``llmgw_backup_failures_total``. The passphrase is read once from its
file at start and kept in memory only; it is never given to a child process (``pg_dump`` gets the
database's password, not this).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmgw.control import events as ev
from llmgw.control.backup import archive, sealed

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "llmgw-backup-", ".llmgwbak"
_OURS = re.compile(r"llmgw-backup-\d{8}T\d{6}\.\d{3}Z\.llmgwbak")
OBJECT = "cluster/backup"
#: How often a standby (or a leader waiting for the next backup) looks again.
POLL_S = 5.0

REGISTRY = CollectorRegistry(auto_describe=True)
LAST_SUCCESS = Gauge("llmgw_backup_last_success_timestamp_seconds", "When the last scheduled backup was written "
                     "(seconds since the epoch; 0: none by this server)", registry=REGISTRY)
LAST_SIZE = Gauge("llmgw_backup_last_size_bytes", "The last scheduled backup's size", registry=REGISTRY)
FAILURES = Counter("llmgw_backup_failures", "Scheduled backups that failed", registry=REGISTRY)


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    dir: Path
    every_s: float
    keep: int
    passphrase: str = dataclasses.field(repr=False)


def file_name(now: float) -> str:
    """``llmgw-backup-20261205T064012.345Z.llmgwbak``: UTC, so names sort as times do."""
    return f"{PREFIX}{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{int(now * 1000) % 1000:03d}Z{SUFFIX}"


def ours(directory: Path) -> list[Path]:
    """The scheduled backups in ``directory`` (the name's pattern and the magic both), oldest first."""
    try:
        names = sorted(p for p in directory.iterdir() if _OURS.fullmatch(p.name) and p.is_file())
    except FileNotFoundError:
        return []
    return [p for p in names if sealed.is_backup(p)]


def prune(directory: Path, keep: int) -> list[Path]:
    """Deletes all but the ``keep`` newest scheduled backups in ``directory``; the ones deleted."""
    found = ours(directory)
    gone = found[:-keep] if keep > 0 else found
    for p in gone:
        p.unlink(missing_ok=True)
        log.info("deleted %s: more than --backup-keep %d scheduled backups", p, keep)
    return gone


def due_at(schedule: Schedule) -> float:
    """When the next backup is due: ``every`` after the newest scheduled one, or now when there is none."""
    found = ours(schedule.dir)
    return found[-1].stat().st_mtime + schedule.every_s if found else 0.0


def run_once(schedule: Schedule, *, data_dir: Path, database: str, now: float) -> archive.Made:
    """One scheduled backup, then the retention."""
    schedule.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    made = archive.make(schedule.dir / file_name(now), schedule.passphrase, data_dir=data_dir, database=database)
    prune(schedule.dir, schedule.keep)
    return made


async def run(schedule: Schedule, *, data_dir: Path, database: str, leading: Callable[[], bool],
              record: Callable[[ev.Event], None], poll_s: float = POLL_S) -> None:
    """Backs up when due, while leading, until cancelled."""
    log.info("scheduled backups: every %gs into %s, the %d newest kept", schedule.every_s, schedule.dir,
             schedule.keep)
    while True:
        wait = due_at(schedule) - time.time()
        if wait > 0 or not leading():
            await asyncio.sleep(min(max(wait, 0.0), poll_s) or poll_s)
            continue
        now = time.time()
        try:
            made = await asyncio.to_thread(run_once, schedule, data_dir=data_dir, database=database, now=now)
        except Exception as e:  # noqa: BLE001 - any failure is told, and the next one tried
            FAILURES.inc()
            said = f"the scheduled backup into {schedule.dir} failed: {e}; the next is tried in {schedule.every_s:g}s"
            log.warning("%s", said)
            record(ev.Event(time.time(), ev.WARNING, "BackupFailed", OBJECT, said))
            await asyncio.sleep(schedule.every_s)
            continue
        LAST_SUCCESS.set(time.time())
        LAST_SIZE.set(made.size)
        record(ev.Event(time.time(), ev.NORMAL, "BackupWritten", OBJECT,
                        f"backed up to {made.path} ({made.size} bytes, {made.kind} store)"))
