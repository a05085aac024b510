"""Credentials: REST API tokens (users' CLI tokens, UI sessions, routers') and the node certificates signed.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0007"


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(63), nullable=False, index=True),
        sa.Column("label", sa.String(120), nullable=False, server_default=""),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False, server_default="0"),
        sa.Column("last_used_at", sa.Float, nullable=False, server_default="0"),
    )
    op.create_table(
        "node_certs",
        sa.Column("serial", sa.String(40), primary_key=True),
        sa.Column("node_id", sa.String(253), nullable=False, index=True),
        sa.Column("issued_at", sa.Float, nullable=False),
        sa.Column("not_after", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("node_certs")
    op.drop_table("api_tokens")
