"""Projects, usage metering and cluster-wide budgets (issue 26).

Every existing key moves to the ``default`` project, which this migration makes, so a cluster upgraded
from 0013 serves exactly as before (``make up`` needs no project). Keys gain ``user`` and ``limits``;
the usage rollups, the optional per-request log, the journals' marks and the quota ledger and leases
are new tables.

Revision ID: 0014
Revises: 0013
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): itself, as for
#: every migration before 0.1.0 (the first release), which no other release ever ran beside.
floor = "0014"

_KEY = (sa.Column("project", sa.String(63), primary_key=True), sa.Column("key", sa.String(32), primary_key=True),
        sa.Column("model", sa.String(253), primary_key=True), sa.Column("user", sa.String(63), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True))


def upgrade() -> None:
    projects = op.create_table(
        "projects",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("description", sa.String(500), nullable=False, server_default=""),
        sa.Column("limits", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(253), nullable=False, server_default=""),
    )
    op.bulk_insert(projects, [{"name": "default", "description": "Keys made before projects, and anyone's",
                               "limits": {}, "created_at": time.time(), "created_by": "migration 0014"}])
    op.create_table(
        "project_members",
        sa.Column("project", sa.String(63), primary_key=True),
        sa.Column("user", sa.String(63), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("project", sa.String(63), nullable=False, server_default="default"))
        batch.add_column(sa.Column("user", sa.String(63), nullable=False, server_default=""))
        batch.add_column(sa.Column("limits", sa.JSON, nullable=False, server_default="{}"))
    op.create_table(
        "usage_rollups",
        sa.Column("grain", sa.String(1), primary_key=True),
        sa.Column("start", sa.BigInteger, primary_key=True),
        *(sa.Column(c.name, c.type, primary_key=True) for c in _KEY),
        *(sa.Column(n, sa.BigInteger, nullable=False, server_default="0")
          for n in ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens", "spend_micros",
                    "ttft_count")),
        sa.Column("ttft_ms_sum", sa.Float, nullable=False, server_default="0"),
        sa.Column("duration_ms_sum", sa.Float, nullable=False, server_default="0"),
        sa.Column("ttft_hist", sa.JSON, nullable=False),
    )
    op.create_index("ix_usage_rollups_grain_start", "usage_rollups", ["grain", "start"])
    op.create_table(
        "usage_requests",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False, index=True),
        *(sa.Column(n, sa.String(w), nullable=False, server_default="")
          for n, w in (("router", 253), ("project", 63), ("key", 32), ("user", 63), ("model", 253), ("node", 253),
                       ("replica", 253))),
        *(sa.Column(n, sa.BigInteger, nullable=False, server_default="0")
          for n in ("prompt_tokens", "cached_tokens", "completion_tokens", "spend_micros")),
        sa.Column("status", sa.Integer, nullable=False, server_default="0"),
        sa.Column("ttft_ms", sa.Float, nullable=False, server_default="0"),
        sa.Column("duration_ms", sa.Float, nullable=False, server_default="0"),
    )
    op.create_table(
        "usage_marks",
        sa.Column("journal", sa.String(64), primary_key=True),
        sa.Column("router", sa.String(253), nullable=False, server_default=""),
        sa.Column("applied_through", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.Float, nullable=False, server_default="0"),
    )
    op.create_table(
        "quota_ledger",
        sa.Column("budget", sa.String(400), primary_key=True),
        sa.Column("limit", sa.BigInteger, nullable=False),
        sa.Column("charged", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("period_end", sa.Float, nullable=False, index=True),
        sa.Column("marks", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.Float, nullable=False, server_default="0"),
    )
    op.create_table(
        "quota_leases",
        sa.Column("budget", sa.String(400), primary_key=True),
        sa.Column("router", sa.String(253), primary_key=True),
        sa.Column("held", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("quota_leases", "quota_ledger", "usage_marks", "usage_requests", "usage_rollups",
                  "project_members", "projects"):
        op.drop_table(table)
    with op.batch_alter_table("api_keys") as batch:
        for column in ("limits", "user", "project"):
            batch.drop_column(column)
