"""The cluster's spec policy settings (issue 24): which extra env names and whether remote code is allowed.

One row per key, its value as JSON. Kept apart from the ``settings`` table (engine install settings that
``llmgw server`` writes from its flags at every start): these change only through the admin's audited
``PUT /api/v1/settings``, never as a side effect of a server flag.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0013"


def upgrade() -> None:
    op.create_table(
        "cluster_settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False, server_default="0"),
        sa.Column("updated_by", sa.String(253), nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("cluster_settings")
