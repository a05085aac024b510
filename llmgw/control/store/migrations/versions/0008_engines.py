"""Engine provisioning: the engine versions wanted per node or pool, and cluster settings (the package index).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0008"


def upgrade() -> None:
    op.create_table(
        "engine_wants",
        sa.Column("scope", sa.String(320), primary_key=True),
        sa.Column("engine", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("settings")
    op.drop_table("engine_wants")
