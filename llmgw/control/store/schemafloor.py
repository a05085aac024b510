"""The schema floor (issue 29): which releases may run against the database's schema, decided at start.

Store migrations are expand-then-contract. Each migration module declares ``floor = "NNNN"``: the oldest
migration head a release's code may have and still run correctly against a database at that revision. An
expanding migration (a table, a nullable or defaulted column, an index) keeps the floor of the one before it,
so the release before runs beside it; a contracting one (a drop, a rename, a column made NOT NULL without a
default, a type changed) raises it, and drops only what the release before no longer uses (expand in release
N, contract in N+1). ``tests/unit/test_migration_floors.py`` checks the chain (``migrationlint``).

After migrating, the store records the floor of the database's revision and the llmgw version that wrote the
schema in the ``settings`` key/value table (``FLOOR_KEY``, ``WRITER_KEY``): an older release, which cannot
know a newer revision, reads them to decide whether it may run beside the newer one (a rolling upgrade) or
must refuse to start. 0.1.0 reads only the ``settings`` keys it knows, so it ignores these.

``decide`` and ``record`` are pure; ``load_chain``, ``read_record`` and ``write_record`` do the I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
from collections.abc import Mapping

import sqlalchemy as sa
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory

from llmgw.core.errors import LlmgwError

#: The ``settings`` rows the record is kept in (0.1.0 reads only its engine keys from that table).
FLOOR_KEY = "schema_floor"
WRITER_KEY = "schema_written_by"
KEYS = (FLOOR_KEY, WRITER_KEY)


class SchemaTooNew(LlmgwError, RuntimeError):
    """The database's schema is newer than this release knows and its floor is above this release's head:
    nothing was changed; the message says which release to run instead."""


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    revision: str
    #: The floor the module declares; None when it declares none (the lint refuses that; at run time the
    #: migration counts as its own floor, the cautious reading).
    floor: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Chain:
    """The migrations this code has, oldest first (one line: llmgw's migrations never branch)."""

    migrations: tuple[Migration, ...]

    @property
    def head(self) -> str:
        return self.migrations[-1].revision

    def knows(self, revision: str) -> bool:
        return any(m.revision == revision for m in self.migrations)

    def position(self, revision: str) -> int:
        """The revision's place in the chain (0 for the first); ValueError for one this code does not know."""
        for i, m in enumerate(self.migrations):
            if m.revision == revision:
                return i
        raise ValueError(f"revision {revision!r} is not in this chain")

    def floor_of(self, revision: str) -> str:
        m = self.migrations[self.position(revision)]
        return m.floor if m.floor is not None else m.revision


class Action(enum.Enum):
    #: A revision this code knows (or an empty database): upgrade to the head as always, then record.
    UPGRADE = "upgrade"
    #: A newer release's revision whose floor this code reaches: change nothing and run beside it.
    BESIDE = "beside"
    #: A newer release's revision whose floor is above this code's head (or that records none): refuse.
    REFUSE = "refuse"


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    #: The warning (BESIDE) or the refusal's sentence (REFUSE); "" for UPGRADE.
    message: str = ""


_RESTORE = "or restore a backup taken before the upgrade (`llmgw restore`)"


def decide(chain: Chain, at: str | None, recorded: Mapping[str, str], mine: str) -> Verdict:
    """What a release whose migrations are ``chain`` (its version ``mine``) does with a database at revision
    ``at`` (None: no schema yet) whose record is ``recorded`` (``read_record``)."""
    if at is None or chain.knows(at):
        return Verdict(Action.UPGRADE)
    floor, writer = recorded.get(FLOOR_KEY, ""), recorded.get(WRITER_KEY, "")
    by = f", written by llmgw {writer}," if writer else ","
    knows = f"this llmgw {mine} knows schema up to {chain.head}"
    if not floor:
        return Verdict(Action.REFUSE, f"the database's schema is at {at}{by} which this llmgw does not know and "
                                      f"which records no schema floor, so no older release may run against it; "
                                      f"{knows}: run the llmgw release that migrated it or newer, {_RESTORE}")
    if chain.knows(floor):
        # The floor is one of ours: this code's head is at or past it, so it reads and writes that schema.
        return Verdict(Action.BESIDE, f"the database's schema is at {at}{by} newer than this llmgw {mine} knows (up to "
                                      f"{chain.head}); its floor {floor} "
                                      "lets this release run beside the newer one (as during a rolling upgrade): "
                                      f"not migrating; upgrade this control plane to llmgw {writer or 'that release'} "
                                      "when the others are")
    newer = f"llmgw {writer} or newer" if writer else "the llmgw release that migrated it or newer"
    return Verdict(Action.REFUSE, f"the database's schema is at {at}{by} which no release before schema {floor} "
                                  f"may run against; {knows}: run {newer}, {_RESTORE}")


def record(chain: Chain, before: str | None, recorded: Mapping[str, str], mine: str) -> dict[str, str]:
    """The ``settings`` rows to write after upgrading a database that was at ``before`` to ``chain``'s head:
    the head's floor when it changed, and this version as the writer when it applied a migration (or when no
    writer is recorded: a schema from before the record, 0.1.0's). Empty when nothing changes."""
    out: dict[str, str] = {}
    floor = chain.floor_of(chain.head)
    if recorded.get(FLOOR_KEY) != floor:
        out[FLOOR_KEY] = floor
    if (before != chain.head or not recorded.get(WRITER_KEY)) and recorded.get(WRITER_KEY) != mine:
        out[WRITER_KEY] = mine
    return out


def load_chain(location: pathlib.Path) -> Chain:
    """The chain of the migrations in ``location`` (an Alembic script directory), each with its floor."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(location))
    scripts = list(ScriptDirectory.from_config(cfg).walk_revisions())  # newest first
    return Chain(tuple(Migration(s.revision, getattr(s.module, "floor", None)) for s in reversed(scripts)))


def read_record(conn: sa.Connection) -> dict[str, str]:
    """The record's rows, as far as they are there (no ``settings`` table yet: none)."""
    if not sa.inspect(conn).has_table("settings"):
        return {}
    rows = conn.execute(sa.text("SELECT key, value FROM settings WHERE key IN (:f, :w)"),
                        {"f": FLOOR_KEY, "w": WRITER_KEY})
    return {str(k): str(v) for k, v in rows}


def write_record(conn: sa.Connection, rows: Mapping[str, str]) -> None:
    """Writes ``rows`` into ``settings`` on ``conn``, in the migration's own transaction."""
    for key, value in rows.items():
        updated = conn.execute(sa.text("UPDATE settings SET value = :v WHERE key = :k"), {"k": key, "v": value})
        if not updated.rowcount:
            conn.execute(sa.text("INSERT INTO settings (key, value) VALUES (:k, :v)"), {"k": key, "v": value})
