"""The store's consistent copy, and putting it back: SQLite's online backup, or pg_dump and pg_restore.

SQLite: ``sqlite3``'s backup API in one step (``pages=-1``) reads the whole database inside one read
transaction; under WAL (the store's mode) a reader never blocks the server's writers and sees one
commit's state throughout, so the copy is consistent while the server runs and writes. The copy is
checked (``PRAGMA quick_check``) before it goes in a backup.

PostgreSQL: ``pg_dump --format=custom`` (one transaction, a consistent snapshot, while the control planes
run), restored with ``pg_restore --single-transaction --exit-on-error --no-owner --no-acl`` into an empty
database (owned by whoever restores). Both are run from an argv list; the URL's password is never on it:
it goes to the child's environment as ``PGPASSWORD`` (which only the child and root can read), and the
connection is given as a libpq conninfo without it. Without a password in the URL, libpq's own ways
(``~/.pgpass``, ``PGPASSFILE``) apply. What pg_dump says on failure is quoted; libpq never puts a
password in its messages.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import url as sa_url

from llmgw.core.errors import LlmgwError

#: The libpq settings a URL's query may carry that are passed on (others are refused by name).
_LIBPQ_QUERY = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "connect_timeout", "application_name",
                "options", "target_session_attrs", "gssencmode", "channel_binding")


def sqlite_copy(db: Path, dest: Path) -> None:
    """A consistent copy of the SQLite database ``db`` into ``dest`` (made 0600), while others write it."""
    if not db.is_file():
        raise LlmgwError(f"{db} does not exist: this data directory has no SQLite store (give --database URL if "
                         "its cluster's store is PostgreSQL)")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.close(fd)
    src = sqlite3.connect(db, timeout=30)  # read only by use: a read-only open of a WAL file needs its -shm
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out, pages=-1)
            out.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
            found = out.execute("PRAGMA quick_check").fetchone()
            if not found or found[0] != "ok":
                raise LlmgwError(f"the copy of {db} fails SQLite's check ({found[0] if found else 'no answer'}); "
                                 "run `sqlite3 llmgw.db 'PRAGMA integrity_check'` on the server's copy")
        finally:
            out.close()
    except sqlite3.Error as e:
        raise LlmgwError(f"cannot copy the SQLite store {db}: {e}") from None
    finally:
        src.close()


def _bin(name: str) -> str:
    """``pg_dump`` or ``pg_restore``: PATH (Debian's wrapper picks the version), then the newest of Debian's."""
    found = shutil.which(name)
    if found:
        return found
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(Path(d) / name, os.X_OK):
            return str(Path(d) / name)
    raise LlmgwError(f"{name} was not found (PATH, /usr/lib/postgresql/*/bin): install PostgreSQL's client "
                     "programs (Debian: `apt-get install postgresql-client`), at least the server's major version")


def libpq(url: str) -> tuple[str, dict[str, str]]:
    """A SQLAlchemy PostgreSQL URL as (libpq conninfo without the password, the child's environment)."""
    from psycopg.conninfo import make_conninfo

    parsed = sa_url.make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        raise LlmgwError("not a PostgreSQL URL: pg_dump backs up PostgreSQL only")
    params: dict[str, str] = {}
    for key, value in parsed.query.items():
        if key not in _LIBPQ_QUERY:
            raise LlmgwError(f"the database URL's query parameter {key!r} is not passed to pg_dump; leave it out "
                             f"(passed: {', '.join(_LIBPQ_QUERY)})")
        params[key] = value if isinstance(value, str) else value[-1]
    for key, value in (("host", parsed.host), ("port", parsed.port), ("user", parsed.username),
                       ("dbname", parsed.database)):
        if value:
            params[key] = str(value)
    # Neither the backup's passphrase (`llmgw backup` may have it in LLMGW_BACKUP_PASSPHRASE) nor the URL's other
    # copy reaches the child: it gets the database's password alone.
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "LLMGW_BACKUP_PASSPHRASE", "LLMGW_DATABASE")}
    if parsed.password:
        env["PGPASSWORD"] = str(parsed.password)
    return make_conninfo(**params), env


def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = " ".join(done.stderr.strip().splitlines()[-3:]) or f"exit status {done.returncode}"
        raise LlmgwError(f"{what} failed: {said}")


def pg_dump(url: str, dest: Path) -> None:
    """``pg_dump --format=custom`` of ``url``'s database into ``dest`` (in a 0700 directory)."""
    conninfo, env = libpq(url)
    _run([_bin("pg_dump"), "--format=custom", "--no-password", "--file", str(dest), "--dbname", conninfo], env,
         "pg_dump of the store")


def pg_restore(url: str, dump: Path) -> None:
    """Restores ``dump`` into ``url``'s (empty) database, all or nothing."""
    conninfo, env = libpq(url)
    _run([_bin("pg_restore"), "--single-transaction", "--exit-on-error", "--no-owner", "--no-acl", "--no-password",
          "--dbname", conninfo, str(dump)], env, "pg_restore into the database given")


def release_lease(url: str) -> None:
    """Ends the leader lease a restored store holds: the backup was taken from a running leader, and its lease
    (held by an instance that does not run against this copy) would keep the restored server a standby,
    answering 503, until it expired. The term is kept, so the restored leader's is higher than any an agent saw."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE leases SET expires_at = 0"))
    except sa.exc.SQLAlchemyError as e:
        reason = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
        raise LlmgwError(f"cannot end the restored store's leader lease: {reason}") from None
    finally:
        with contextlib.suppress(Exception):
            engine.dispose()


def database_tables(url: str) -> list[str]:
    """The tables of ``url``'s database outside PostgreSQL's own schemas (empty: a database to restore into)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(
                "SELECT schemaname || '.' || tablename FROM pg_tables "
                "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1")).scalars())
    except sa.exc.SQLAlchemyError as e:
        reason = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
        raise LlmgwError(f"cannot reach the database given to restore into: {reason}") from None
    finally:
        with contextlib.suppress(Exception):
            engine.dispose()
