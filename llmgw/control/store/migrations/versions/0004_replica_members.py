"""The ranks of a replica that spans nodes, and its leader's address and rendezvous port.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0004"


def upgrade() -> None:
    # Server defaults: a replica written by an older version is a one-node one
    # (no members), so upgrading a data directory needs no data migration.
    with op.batch_alter_table("replicas") as t:
        t.add_column(sa.Column("members", sa.JSON, nullable=False, server_default="[]"))
        t.add_column(sa.Column("leader_addr", sa.String(253), nullable=False, server_default=""))
        t.add_column(sa.Column("leader_port", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as t:
        t.drop_column("leader_port")
        t.drop_column("leader_addr")
        t.drop_column("members")
