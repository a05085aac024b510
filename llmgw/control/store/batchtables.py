"""The OpenAI Files and Batches tables (issue 32): uploaded files, their bytes, batches and each batch's lines.

``oai_files`` describes a file (its project, purpose, name, size); its bytes are in ``oai_file_chunks`` (on
PostgreSQL, so that every control plane reaches them) or in a file of the data directory (SQLite: one control
plane), as ``oai_files.location`` says. ``oai_batches`` is a batch as OpenAI's Batch object describes it;
``oai_batch_lines`` one row per valid input line (its state: pending, claimed by a router until a time, done with
its answer written once) and per invalid one (``invalid``, its error), so the error file says each with its
``custom_id``. ``migrations/0016_batches`` made them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from llmgw.control.store.tables import Base


class OaiFileRow(Base):
    __tablename__ = "oai_files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project: Mapped[str] = mapped_column(String(63), index=True)
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    #: ``db``: in ``oai_file_chunks``; ``dir``: in the data directory's ``files/`` under the file's id.
    location: Mapped[str] = mapped_column(String(8))


class OaiFileChunkRow(Base):
    __tablename__ = "oai_file_chunks"

    file_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class OaiBatchRow(Base):
    __tablename__ = "oai_batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project: Mapped[str] = mapped_column(String(63), index=True)
    key_id: Mapped[str] = mapped_column(String(32))
    user: Mapped[str] = mapped_column(String(63))
    endpoint: Mapped[str] = mapped_column(String(40))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(8))
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    #: When each status began (OpenAI's ``in_progress_at``, ``completed_at``, ...), by status.
    times: Mapped[dict[str, Any]] = mapped_column(JSON)
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    errors: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class OaiBatchLineRow(Base):
    __tablename__ = "oai_batch_lines"
    #: A batch's lines by state in line order: a claim reads the first pending ones, not every line answered.
    __table_args__ = (Index("ix_oai_batch_lines_state", "batch_id", "state", "idx"),)

    batch_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str | None] = mapped_column(String(512), nullable=True)
    model: Mapped[str] = mapped_column(String(253))
    body: Mapped[str] = mapped_column(Text)
    #: ``pending``, ``claimed`` (by ``claimed_by`` until ``claim_until``), ``done`` or ``invalid``.
    state: Mapped[str] = mapped_column(String(8))
    claimed_by: Mapped[str] = mapped_column(String(128))
    claim_until: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int] = mapped_column(Integer)
    #: The engine's answer (JSON text) for a done line; "" else.
    response: Mapped[str] = mapped_column(Text)
    #: Why the line failed (an invalid line, a request that could not be sent): ``{"code", "message"}`` JSON.
    error: Mapped[str] = mapped_column(Text)
