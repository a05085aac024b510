"""Alembic environment: runs on the connection the store hands in (never a URL from a file)."""

from __future__ import annotations

from alembic import context

from llmgw.control.store import batchtables, usagetables  # noqa: F401 - their tables join Base.metadata
from llmgw.control.store.tables import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
