"""The first schema: models, nodes, replicas.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0001"


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(253), primary_key=True),
        sa.Column("hostname", sa.String(253), nullable=False),
        sa.Column("mgmt_addr", sa.String(253), nullable=False),
        sa.Column("agent_version", sa.String(64), nullable=False),
        sa.Column("inventory", sa.JSON, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(63), nullable=False, index=True),
        sa.Column("fingerprint", sa.String(32), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("node_id", sa.String(253), nullable=True),
        sa.Column("shard_id", sa.String(96), nullable=True),
        sa.Column("api_key", sa.String(96), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("sent_at", sa.Float, nullable=False),
        sa.Column("ready_at", sa.Float, nullable=False),
        sa.Column("endpoint", sa.String(253), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("last_output", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("replicas")
    op.drop_table("nodes")
    op.drop_table("models")
