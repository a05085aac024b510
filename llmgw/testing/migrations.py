"""A newer release's migrations, made in a test: a copy of this release's with synthetic ones after its head.

``newer(tmp, EXPAND, floor="0015")`` is the script directory of a release that added an expanding 0017;
``Store.open_url(url, migrations=that)`` migrates a database as that release would, and this release's
``Store.open_url(url)`` then meets a revision it does not know (``control.store.schemafloor``).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import sqlalchemy as sa

from llmgw.control.store.base import MIGRATIONS

#: An expanding migration: a new table and a nullable column; the release before reads and writes beside it.
EXPAND = """
    op.create_table("future_notes", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("text", sa.Text, nullable=False, server_default=""))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("future_note", sa.Text, nullable=True))
"""
#: A contracting migration: a column the release before writes is dropped.
CONTRACT = """
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("tpm")
"""

_TEMPLATE = '''"""A synthetic migration of a newer release (a test's).

Revision ID: {revision}
Revises: {down}
"""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None
{floor_line}


def upgrade() -> None:
{body}


def downgrade() -> None:
    pass
'''


def copy(dest: Path) -> Path:
    """This release's migrations copied to ``dest`` (an Alembic script directory of its own)."""
    shutil.copytree(MIGRATIONS, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def add(location: Path, revision: str, down: str, body: str, *, floor: str | None) -> Path:
    """Writes migration ``revision`` (after ``down``, upgrading with ``body``) into ``location``'s versions;
    ``floor`` None declares none. Returns the file."""
    path = location / "versions" / f"{revision}_synthetic.py"
    path.write_text(_TEMPLATE.format(revision=revision, down=down,
                                     floor_line=f'floor = "{floor}"' if floor is not None else "",
                                     body=textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")))
    return path


def newer(tmp: Path, body: str, *, floor: str, revision: str = "0017", down: str = "0016") -> Path:
    """A copy of this release's migrations under ``tmp`` with one more; its script directory."""
    location = copy(tmp / f"migrations-{revision}")
    add(location, revision, down, body, floor=floor)
    return location


def snapshot(url: str) -> dict[str, object]:
    """Everything in the database at ``url``: each table's columns and rows (sorted), and its revision; two
    equal snapshots are the proof that a refused start changed nothing."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            out: dict[str, object] = {}
            for table in sorted(inspector.get_table_names()):
                columns = [c["name"] for c in inspector.get_columns(table)]
                rows = conn.execute(sa.text(f'SELECT * FROM "{table}"')).all()  # noqa: S608 - the database's own names
                out[table] = (columns, sorted(repr(tuple(r)) for r in rows))
            return out
    finally:
        engine.dispose()


def set_writer(url: str, version: str) -> None:
    """Says the schema was written by llmgw ``version`` (a newer release's, in a test that has one code)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE settings SET value = :v WHERE key = 'schema_written_by'"), {"v": version})
    finally:
        engine.dispose()
