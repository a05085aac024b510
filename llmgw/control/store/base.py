"""The store's connection: the database URL, the engine and its sessions, the fence, the migrations.

Every part of ``Store`` (one mixin per concern, assembled in ``store.py``) writes through ``_tx``, so
every write is fenced the same way; this module knows no table but the lease row the fence reads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pathlib
from collections.abc import Iterator
from typing import Any, Self

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from llmgw.control.store import schemafloor
from llmgw.control.store.tables import LeaseRow
from llmgw.core.errors import LlmgwError
from llmgw.core.version import version

log = logging.getLogger(__name__)

MIGRATIONS = pathlib.Path(__file__).with_name("migrations")
#: The PostgreSQL advisory lock held while migrating (any fixed 64-bit number; this one spells "llmgwmig").
MIGRATION_LOCK_KEY = 0x6C6C6D67776D6967
#: The URL schemes the store opens: SQLite (the embedded default) and PostgreSQL through psycopg 3.
URL_SCHEMES = ("sqlite", "postgresql+psycopg")


class StoreUrlRefused(LlmgwError, ValueError):
    """A database URL the store does not open; the message says which kinds it does."""


class StoreUnreachable(LlmgwError, RuntimeError):
    """The database did not answer at open; the message names it (password hidden) and what to check."""


class Fenced(LlmgwError, RuntimeError):
    """A write refused because this control plane does not hold the lease at its term (see ``Store.fence``)."""


#: ``Store.fence`` of a standby: it holds no term, so it writes nothing of the cluster's state.
STANDBY = ("", 0)


def unreachable(e: BaseException) -> str:
    """The first line of why, when ``e`` says the database did not answer (down, restarting, cut off); "" else."""
    if isinstance(e, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return (str(e.orig or e).strip().splitlines() or [type(e).__name__])[0]
    return ""


def sqlite_url(data_dir: pathlib.Path) -> str:
    """The embedded default: ``llmgw.db`` in the data directory."""
    return f"sqlite:///{data_dir / 'llmgw.db'}"


def check_url(url: str) -> None:
    """Raises StoreUrlRefused unless ``url`` is one the store opens."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in URL_SCHEMES:
        # Say the shape, never the URL itself: it may carry a password.
        raise StoreUrlRefused(f"database URL scheme {scheme or '(none)'!r} is not supported: use "
                              "postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DB for PostgreSQL, or leave "
                              "--database out for SQLite in the data directory")


def db_text(s: str) -> str:
    """Text as every database stores it: PostgreSQL refuses a NUL in a text column ("text fields cannot
    contain NUL"), which an engine's output in a replica's message or an event can carry; SQLite took it."""
    return s.replace("\x00", "\ufffd")


class StoreBase:
    """The connection and the fenced write transaction every part of ``Store`` writes through."""

    def __init__(self, url: str, *, migrations: pathlib.Path = MIGRATIONS,
                 idle_tx_timeout_s: float | None = None) -> None:
        self.url = url
        #: The Alembic script directory this store migrates with: the package's (tests hand in a copy with
        #: synthetic newer migrations, to be a newer release's database).
        self.migrations = migrations
        sqlite = url.startswith("sqlite")
        # pool_pre_ping: a PostgreSQL that restarted leaves dead connections in the pool; without it the
        # first statement after the restart fails instead of reconnecting.
        self.engine = sa.create_engine(url, connect_args={"check_same_thread": False} if sqlite else {},
                                       pool_pre_ping=not sqlite)
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        elif idle_tx_timeout_s:
            # PostgreSQL ends a session of this process's that waits inside a transaction this long: a server
            # stopped mid-write (SIGSTOP, a frozen VM) then holds no lock that keeps another control plane out,
            # whatever that one's release (LeadershipStore._end_stalled_holders is the standby's own remedy).
            event.listen(self.engine, "connect", functools.partial(_pg_idle_timeout, ms=int(idle_tx_timeout_s * 1000)))
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        #: (holder, term) every write must find in the lease row, in its own transaction; ``STANDBY``: no
        #: write at all; None: unchecked (one server without election: the CLI, ``llmgw init``, unit tests).
        self.fence: tuple[str, int] | None = None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Session]:
        """A write transaction, fenced: the lease row is read (FOR SHARE on PostgreSQL) before anything is
        written, and a term other than ``fence``'s rolls the whole transaction back with Fenced.

        The row lock is what makes it a fence and not a check: a standby's takeover (an UPDATE of that row)
        waits for the writes that read it to commit, and every write after the takeover sees the new term.
        So a leader that was paused past its lease (SIGSTOP, a VM migration, a long GC) and wakes up can
        finish no write, whatever its own clock says.
        """
        fence = self.fence
        with self._session.begin() as s:
            if fence is not None:
                self._check_fence(s, fence)
            yield s

    @contextlib.contextmanager
    def _append_tx(self) -> Iterator[Session]:
        """A transaction for appending a fact about the past (an audit entry): refused on a standby, as every
        write, but not fenced by the lease's term. A leader deposed between a change it made under its lease
        and the entry saying so (paused past the lease) still records that the change happened: the entry is
        history, not the cluster's state, and losing it would hide a change that was made."""
        fence = self.fence
        if fence is not None and fence[1] == 0:
            raise Fenced("this control plane is a standby and writes nothing; the leader does")
        with self._session.begin() as s:
            yield s

    def _check_fence(self, s: Session, fence: tuple[str, int]) -> None:
        holder, term = fence
        if term == 0:
            raise Fenced("this control plane is a standby and writes nothing; the leader does")
        row = s.execute(sa.select(LeaseRow.holder, LeaseRow.term).where(LeaseRow.name == "leader")
                        .with_for_update(read=True)).first()
        if row is None or (row.holder, row.term) != (holder, term):
            now_held = f"held by {row.holder} at term {row.term}" if row is not None else "held by nobody"
            raise Fenced(f"this control plane led at term {term} and the lease is now {now_held}: it was deposed "
                         "(paused or cut off past its lease) and writes nothing more")

    def db_now(self) -> float:
        """The database server's clock, in seconds since the epoch: the one clock every lease time is on."""
        with self.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                return float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
            return float(conn.execute(sa.text("SELECT (julianday('now') - 2440587.5) * 86400.0")).scalar_one())

    @classmethod
    def open(cls, data_dir: pathlib.Path, *, migrations: pathlib.Path = MIGRATIONS) -> Self:
        """Opens (creating and migrating as needed) the SQLite database in ``data_dir``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls.open_url(sqlite_url(data_dir), migrations=migrations)

    @classmethod
    def open_url(cls, url: str, *, migrations: pathlib.Path = MIGRATIONS,
                 idle_tx_timeout_s: float | None = None) -> Self:
        """Opens (migrating as needed) the database at a SQLAlchemy URL: ``sqlite:///…`` or
        ``postgresql+psycopg://…``. Raises StoreUrlRefused for any other kind, and
        ``schemafloor.SchemaTooNew`` (nothing changed) for a newer release's schema this one may not run on."""
        check_url(url)
        store = cls(url, migrations=migrations, idle_tx_timeout_s=idle_tx_timeout_s)
        try:
            store.migrate()
        except sa.exc.OperationalError as e:
            store.close()
            where = sa.engine.make_url(url).render_as_string(hide_password=True)
            cause = str(e.orig or e).strip().splitlines()[0]
            raise StoreUnreachable(f"cannot reach the database {where}: {cause}; check that the server runs "
                                   "there and accepts this user, or fix --database") from None
        except BaseException:
            store.close()
            raise
        return store

    def migrate(self) -> None:
        """Upgrades the schema to the newest revision, once even when several servers start together.

        On PostgreSQL a transaction-scoped advisory lock is held around the upgrade: without it two
        servers starting at once against an empty database both see no ``alembic_version`` and both
        run CREATE TABLE, and the second fails with "relation already exists". The second waits on the
        lock, then finds the head revision and does nothing; the lock goes with the transaction, even on
        an error. SQLite is unchanged: one server per data directory.

        Before anything is changed, under that lock, the schema floor is checked (``schemafloor.decide``): a
        revision this code does not know is a newer release's, and this one then either runs beside it without
        migrating (a WARNING; its recorded floor is at or below this code's head) or raises SchemaTooNew having
        changed nothing. After an upgrade the head's floor and this version are recorded in ``settings``, in
        the same transaction.
        """
        chain = schemafloor.load_chain(self.migrations)
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(self.migrations))
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            at = MigrationContext.configure(conn).get_current_revision()
            recorded = schemafloor.read_record(conn)
            verdict = schemafloor.decide(chain, at, recorded, version())
            if verdict.action is schemafloor.Action.REFUSE:
                raise schemafloor.SchemaTooNew(verdict.message)
            if verdict.action is schemafloor.Action.BESIDE:
                log.warning("%s", verdict.message)
                return
            if at != chain.head:  # at the head already: nothing to upgrade (and Alembic's scripts not loaded twice)
                cfg.attributes["connection"] = conn
                alembic_command.upgrade(cfg, "head")
            schemafloor.write_record(conn, schemafloor.record(chain, at, recorded, version()))

    def close(self) -> None:
        self.engine.dispose()


def _pg_idle_timeout(dbapi_conn: Any, _record: Any, *, ms: int) -> None:
    # In autocommit: a SET inside the transaction psycopg would open is undone by the pool's rollback on return.
    was, dbapi_conn.autocommit = dbapi_conn.autocommit, True
    try:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET idle_in_transaction_session_timeout = {int(ms)}")
    finally:
        dbapi_conn.autocommit = was


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the CLI and tests read while the server writes; without it a
    # reader during a write gets "database is locked".
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()
