"""Single sign-on (issue 28): users made by SSO, the flows begun and not finished, and each SSO user's link.

``users.source`` says whether a user has a password ("local") or comes from the identity provider ("sso");
``sso_pending`` holds a browser's state (nonce, PKCE verifier) or a device flow's handle, taken once, in the
store so that any control plane of an HA pair finishes what another began; ``sso_links`` holds each SSO
user's provider subject and sealed refresh token.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): 0015, 0.1.0's head,
#: the first release's schema; an expanding 0016 keeps it so that 0.1.0 runs beside the release that adds it.
floor = "0015"


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("source", sa.String(16), nullable=False, server_default="local"))
    op.create_table(
        "sso_pending",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False, index=True),
    )
    op.create_table(
        "sso_links",
        sa.Column("user", sa.String(63), primary_key=True),
        sa.Column("subject", sa.String(600), nullable=False),
        sa.Column("refresh_token", sa.Text, nullable=False, server_default=""),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("refreshed_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sso_links")
    op.drop_table("sso_pending")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("source")
