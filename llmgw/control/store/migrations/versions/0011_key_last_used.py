"""When each API key last called the OpenAI API (issue 16): what the keys page and `llmgw key list` show.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0011"


def upgrade() -> None:
    # 0 is "never": existing keys have no recorded use, and a NOT NULL column with a server default
    # is added in place on both SQLite and PostgreSQL (no table copy).
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("last_used_at", sa.Float, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("last_used_at")
