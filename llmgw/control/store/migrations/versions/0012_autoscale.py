"""The autoscaler's state per autoscaled model (issue 17): the count in force, its windows, its last reason.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0012"


def upgrade() -> None:
    op.create_table(
        "autoscale",
        sa.Column("model", sa.String(63), primary_key=True),
        sa.Column("replicas", sa.Integer, nullable=False),
        sa.Column("above_since", sa.Float, nullable=True),
        sa.Column("below_since", sa.Float, nullable=True),
        sa.Column("idle_since", sa.Float, nullable=True),
        sa.Column("last_scale_up_at", sa.Float, nullable=False, server_default="0"),
        sa.Column("last_change_at", sa.Float, nullable=False, server_default="0"),
        sa.Column("last_reason", sa.Text, nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("autoscale")
