"""Onboarding: bootstrap tokens (hashed) and users (argon2 password hashes).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0005"


def upgrade() -> None:
    op.create_table(
        "bootstrap_tokens",
        sa.Column("id", sa.String(6), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("node_name", sa.String(253), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("uses_left", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "users",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("users")
    op.drop_table("bootstrap_tokens")
