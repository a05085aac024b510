"""Conditions on replicas and models, the events log, a node's cordon/drain marks, a replica's GPUs and memory.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0003"


def upgrade() -> None:
    # Server defaults: rows written by an older version get valid values, so
    # upgrading a data directory with replicas on it needs no data migration.
    with op.batch_alter_table("replicas") as t:
        t.add_column(sa.Column("conditions", sa.JSON, nullable=False, server_default="[]"))
        t.add_column(sa.Column("gpus", sa.JSON, nullable=False, server_default="[]"))
        t.add_column(sa.Column("memory_bytes", sa.BigInteger, nullable=False, server_default="0"))
        t.add_column(sa.Column("memory_estimated", sa.Boolean, nullable=False, server_default=sa.false()))
    with op.batch_alter_table("models") as t:
        t.add_column(sa.Column("conditions", sa.JSON, nullable=False, server_default="[]"))
    with op.batch_alter_table("nodes") as t:
        t.add_column(sa.Column("cordoned", sa.Boolean, nullable=False, server_default=sa.false()))
        t.add_column(sa.Column("draining", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("object", sa.String(320), nullable=False, index=True),
        sa.Column("model", sa.String(63), nullable=False, index=True),
        sa.Column("node", sa.String(253), nullable=False, index=True),
        sa.Column("message", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("events")
    with op.batch_alter_table("nodes") as t:
        t.drop_column("draining")
        t.drop_column("cordoned")
    with op.batch_alter_table("models") as t:
        t.drop_column("conditions")
    with op.batch_alter_table("replicas") as t:
        t.drop_column("memory_estimated")
        t.drop_column("memory_bytes")
        t.drop_column("gpus")
        t.drop_column("conditions")
