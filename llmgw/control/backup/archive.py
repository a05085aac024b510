"""What a backup holds, written (``make``) and put back (``restore``): a tar stream, gzipped, sealed (``sealed``).

In it, in this order:

- ``manifest.json``: the format, the llmgw version that wrote it, when, the cluster CA's hash and which
  kind of store (``sqlite`` or ``postgresql``; the URL without its password, for the reader's information);
- ``data/…``: from the data directory, what makes a new machine the same cluster: ``pki/`` (the cluster
  CA's certificate and key, without which no agent's certificate would verify and none could reconnect;
  the agent port's and the HTTP port's certificates and keys), ``initial-admin-password`` when it is
  still there, and the in-process router's usage journals (``usage-journal*/``: requests metered but not
  yet stored; they carry their own ids and numbers, so the restored server stores what its database lacks
  and nothing twice). Read before the database is copied, so whatever they hold that the copy also has is
  a duplicate the store drops, never a gap;
- ``database/llmgw.db`` (SQLite's online backup) or ``database/llmgw.pgdump`` (pg_dump's custom format):
  models, keys, users, sessions, projects, budgets, usage, nodes, replicas, tokens, settings, events, audit.

Left out, on purpose: ``instance-id`` (a restored control plane is a new instance of the same cluster: a
copy restored beside a running one must not share its identity in the lease), ``database.json`` (written
again by ``restore`` for the database it restores into), ``llmgw.db-wal``/``-shm`` (in the copy),
``logs/``, ``ports.json`` and ``agent/`` (``llmgw up``'s log files and its node's own state, which the node
keeps), and everything outside the data directory: weights (on the nodes, fetched again), the mirror's
files, and the files flags name (``--tls-cert``, ``--sso-client-secret-file``, ``--hub-token-file``,
``--config``…), which the operator keeps with the server's unit file.

``restore`` writes nothing unless the whole file checks out: it reads into a temporary directory beside
the target (0700), restores a PostgreSQL dump only after the last chunk was checked, and gives the
directory its name last; any failure removes what it wrote.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy.engine import url as sa_url

from llmgw.control import datadir
from llmgw.control.backup import database as db_copy
from llmgw.control.backup import sealed
from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.core.version import version

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
SQLITE_MEMBER = "database/llmgw.db"
PG_MEMBER = "database/llmgw.pgdump"
#: The data directory's entries a backup takes (files, or directories of files); nothing else is read.
TAKEN = ("pki", datadir.INITIAL_PASSWORD, "usage-journal", "usage-journal-workers")


@dataclasses.dataclass(frozen=True, slots=True)
class Made:
    path: Path
    size: int
    kind: str
    ca_hash: str


@dataclasses.dataclass(frozen=True, slots=True)
class Restored:
    data_dir: Path
    kind: str
    ca_hash: str
    created: float
    made_by: str


def _data_files(data_dir: Path) -> list[tuple[str, bytes, int]]:
    """(path under the data directory, bytes, mode) of every file ``TAKEN`` names, read now."""
    found: list[tuple[str, bytes, int]] = []
    for name in TAKEN:
        top = data_dir / name
        paths = sorted(p for p in top.rglob("*") if p.is_file() and not p.is_symlink()) if top.is_dir() else (
            [top] if top.is_file() and not top.is_symlink() else [])
        for p in paths:
            try:
                found.append((p.relative_to(data_dir).as_posix(), p.read_bytes(), p.stat().st_mode & 0o777))
            except FileNotFoundError:  # a journal segment acknowledged and deleted as we looked: it is stored
                continue
    return found


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, path: Path | None = None,
         mode: int = 0o600) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, int(time.time())
    if path is not None:
        info.size = path.stat().st_size
        with open(path, "rb") as f:
            tar.addfile(info, f)
    else:
        assert data is not None
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def make(out: Path, passphrase: str, *, data_dir: Path, database: str = "", force: bool = False) -> Made:
    """Backs up ``data_dir``'s cluster (its store: ``database``, else the one it remembers) into ``out``."""
    data_dir = data_dir.resolve()
    if not datadir.is_initialised(data_dir):
        raise LlmgwError(f"{data_dir} is not an initialised control plane data directory (no pki/): give the "
                         "server's --data-dir")
    url = datadir.database_for(data_dir, database)
    # SQLite in the data directory, or wherever a sqlite:/// --database puts it; else PostgreSQL.
    sqlite_db: Path | None = None
    if not url:
        sqlite_db = data_dir / datadir.DB
    elif url.startswith("sqlite"):
        sqlite_db = Path(str(sa_url.make_url(url).database or ""))
    kind = "sqlite" if sqlite_db is not None else "postgresql"
    sealed.check_passphrase(passphrase)
    ca_hash = pki.ca_hash(datadir.ca_cert(data_dir).read_bytes())
    out = out.parent.resolve() / out.name
    if out.is_relative_to(data_dir):
        raise LlmgwError(f"{out} is inside the data directory {data_dir}: write the backup elsewhere (another disk "
                         "or machine is best)")
    if not out.parent.is_dir():
        raise LlmgwError(f"{out.parent} is not a directory; nothing was written. Make it first, or give another "
                         "path for the backup")
    try:
        work = Path(tempfile.mkdtemp(prefix=".llmgw-backup-", dir=out.parent))  # 0700, where the file goes
    except OSError as e:
        raise LlmgwError(f"cannot write in {out.parent}: {e.strerror or e}; nothing was written") from None
    try:
        files = _data_files(data_dir)  # before the database: see the module's docstring
        dump = work / Path(SQLITE_MEMBER if kind == "sqlite" else PG_MEMBER).name
        if sqlite_db is not None:
            db_copy.sqlite_copy(sqlite_db, dump)
        else:
            db_copy.pg_dump(url, dump)
        manifest = {"format": FORMAT, "llmgw": version(), "created": time.time(), "ca_hash": ca_hash,
                    "database": kind, "database_url": datadir.without_password(url),
                    "files": [name for name, _, _ in files]}
        # gzip level 1: half the time of level 6 on a store's copy (measured: 83 MB in 1.7-2.1 s, not 3.4-4.7),
        # for a file 3% larger.
        with sealed.SealedWriter(out, passphrase, force=force) as w:
            with gzip.GzipFile(fileobj=w, mode="wb", compresslevel=1, mtime=0) as gz:  # type: ignore[arg-type]
                with tarfile.open(fileobj=gz, mode="w|") as tar:  # type: ignore[call-overload]
                    _add(tar, MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode(), mode=0o644)
                    for name, data, mode in files:
                        _add(tar, f"data/{name}", data, mode=mode)
                    _add(tar, SQLITE_MEMBER if kind == "sqlite" else PG_MEMBER, path=dump)
        size = out.stat().st_size
    except OSError as e:  # a full disk, a file the server's user alone may read…
        raise LlmgwError(f"the backup failed: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}; nothing "
                         f"was written to {out}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("backed up %s (%s store, cluster CA %s) to %s, %d bytes", data_dir, kind, ca_hash, out, size)
    return Made(out, size, kind, ca_hash)


def _member_path(name: str) -> PurePosixPath:
    """A data file's path under the data directory; LlmgwError for anything a backup never holds."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or len(p.parts) < 2 or p.parts[0] != "data" or p.parts[1] not in TAKEN:
        raise sealed.BackupRefused(f"the backup holds {name!r}, which no llmgw backup holds; nothing was written")
    return PurePosixPath(*p.parts[1:])


def _write_file(path: Path, source: Any, mode: int) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode & 0o644)
    with os.fdopen(fd, "wb") as f:
        shutil.copyfileobj(source, f)


def _empty_or_new(data_dir: Path) -> None:
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise LlmgwError(f"{data_dir} is not empty; nothing was written. Restore into a new or empty directory "
                         f"(move {data_dir} aside first if it is this cluster's old one)")


def _check_target(manifest: dict[str, Any], database: str) -> None:
    """Refuses a store kind the flags do not fit, or a PostgreSQL database that is not empty."""
    kind = manifest.get("database")
    if kind == "postgresql":
        if not database:
            raise LlmgwError("this backup holds a PostgreSQL store (pg_dump): give --database URL (or "
                             "LLMGW_DATABASE) naming an empty database to restore it into")
        tables = db_copy.database_tables(database)
        if tables:
            raise LlmgwError(f"the database given holds tables already ({', '.join(tables[:3])}"
                             f"{'…' if len(tables) > 3 else ''}); nothing was written. Restore into a new, empty "
                             "database (`createdb NAME`)")
    elif kind == "sqlite":
        if database:
            raise LlmgwError("this backup holds a SQLite store, restored into the data directory: leave --database "
                             "and LLMGW_DATABASE out")
    else:
        raise sealed.BackupRefused(f"the backup's manifest names no store kind llmgw knows ({kind!r})")


def restore(backup: Path, passphrase: str, *, data_dir: Path, database: str = "") -> Restored:
    """Puts the backup's cluster in the new (or empty) ``data_dir`` and, for PostgreSQL, the empty ``database``."""
    data_dir = data_dir.absolute()
    _empty_or_new(data_dir)
    with sealed.SealedReader(backup, passphrase) as reader:  # a wrong passphrase stops here: nothing written
        gz = gzip.GzipFile(fileobj=reader, mode="rb")  # type: ignore[arg-type]
        tar = tarfile.open(fileobj=gz, mode="r|")  # type: ignore[call-overload]
        first = tar.next()
        if first is None or first.name != MANIFEST or not first.isfile():
            raise sealed.BackupRefused(f"{backup} holds no manifest first; it was not written by `llmgw backup`")
        manifest = json.loads(tar.extractfile(first).read())  # type: ignore[union-attr]
        if manifest.get("format") != FORMAT:
            raise sealed.BackupRefused(f"{backup} has contents of format {manifest.get('format')}; this llmgw "
                                       f"reads {FORMAT}: restore with the version that wrote it "
                                       f"({manifest.get('llmgw', 'unknown')}) or newer")
        _check_target(manifest, database)
        try:
            data_dir.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.restore-", dir=data_dir.parent))
        except OSError as e:
            raise LlmgwError(f"cannot write in {data_dir.parent}: {e.strerror or e}; nothing was written") from None
        try:
            dump = staging / ".restore.pgdump"
            for member in tar:  # the manifest again first (a TarFile's iteration starts with what it read)
                if member is first:
                    continue
                if not member.isfile():
                    raise sealed.BackupRefused(f"the backup holds {member.name!r}, not a file; nothing was written")
                source = tar.extractfile(member)
                if member.name == SQLITE_MEMBER and manifest["database"] == "sqlite":
                    _write_file(staging / datadir.DB, source, 0o600)
                elif member.name == PG_MEMBER and manifest["database"] == "postgresql":
                    _write_file(dump, source, 0o600)
                else:
                    _write_file(staging / _member_path(member.name), source, member.mode)
            while gz.read(1 << 16):  # the tar's end padding, to the gzip stream's end and so the file's
                pass
            if not reader.complete:
                raise sealed.BackupRefused(f"{backup} is cut short or has bytes past its end; nothing was written")
            _check_restored(staging, manifest)
            if manifest["database"] == "postgresql":
                db_copy.pg_restore(database, dump)
                dump.unlink()
                db_copy.release_lease(database)
            else:
                db_copy.release_lease(f"sqlite:///{staging / datadir.DB}")
            datadir.remember_database(staging, database)
            os.chmod(staging, 0o700)
            os.rename(staging, data_dir)  # over an empty directory too (POSIX rename)
        except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise sealed.BackupRefused(f"the restore of {backup} failed ({e}); nothing was written") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    log.info("restored %s into %s (%s store, cluster CA %s)", backup, data_dir, manifest["database"],
             manifest["ca_hash"])
    return Restored(data_dir, manifest["database"], manifest["ca_hash"], float(manifest.get("created", 0)),
                    str(manifest.get("llmgw", "")))


def _check_restored(staging: Path, manifest: dict[str, Any]) -> None:
    """The restored directory has the CA the manifest names, its key, and (SQLite) the database."""
    try:
        ca = datadir.read_ca(staging)
    except OSError as e:
        raise sealed.BackupRefused(f"the backup lacks the cluster CA ({e.strerror or e}); nothing was written") \
            from None
    if pki.ca_hash(ca.cert_pem) != manifest.get("ca_hash"):
        raise sealed.BackupRefused("the backup's CA certificate is not the one its manifest names; nothing was "
                                   "written")
    if manifest["database"] == "sqlite" and not (staging / datadir.DB).is_file():
        raise sealed.BackupRefused("the backup holds no database; nothing was written")
