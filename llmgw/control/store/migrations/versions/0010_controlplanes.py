"""Each control plane instance and where it serves (issue 15): what `llmgw get controlplanes` lists.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0010"


def upgrade() -> None:
    op.create_table(
        "controlplanes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("http_url", sa.String(320), nullable=False, server_default=""),
        sa.Column("agent_addr", sa.String(320), nullable=False, server_default=""),
        sa.Column("version", sa.String(64), nullable=False, server_default=""),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("controlplanes")
