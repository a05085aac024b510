"""OpenAI Files and Batches (issue 32): files and their bytes, batches and their lines. Expand-only: new tables.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None
#: New tables only: 0.2.0 (head 0015) runs beside it and never reads them.
floor = "0015"


def upgrade() -> None:
    op.create_table(
        "oai_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("project", sa.String(63), nullable=False, index=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("location", sa.String(8), nullable=False),
    )
    op.create_table(
        "oai_file_chunks",
        sa.Column("file_id", sa.String(40), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "oai_batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("project", sa.String(63), nullable=False, index=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("user", sa.String(63), nullable=False),
        sa.Column("endpoint", sa.String(40), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("completion_window", sa.String(8), nullable=False),
        sa.Column("meta", sa.JSON, nullable=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("times", sa.JSON, nullable=False),
        sa.Column("output_file_id", sa.String(40), nullable=True),
        sa.Column("error_file_id", sa.String(40), nullable=True),
        sa.Column("errors", sa.JSON, nullable=True),
    )
    op.create_table(
        "oai_batch_lines",
        sa.Column("batch_id", sa.String(40), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.String(512), nullable=True),
        sa.Column("model", sa.String(253), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("claimed_by", sa.String(128), nullable=False),
        sa.Column("claim_until", sa.Float, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=False),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
    )
    op.create_index("ix_oai_batch_lines_state", "oai_batch_lines", ["batch_id", "state", "idx"])


def downgrade() -> None:
    op.drop_index("ix_oai_batch_lines_state", "oai_batch_lines")
    for table in ("oai_batch_lines", "oai_batches", "oai_file_chunks", "oai_files"):
        op.drop_table(table)
