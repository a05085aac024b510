"""The usage and budget tables (issue 26): what routers metered, and the budgets they draw leases from.

The usage rollups per minute, hour and day, the optional per-request log, and each router journal's mark
(``usage``); each budget's ledger for its period and the leases routers hold on it (``quotas``). Declared on
``tables.Base``, so they are one schema with the rest; ``migrations/0014_projects_usage_quotas`` made them.
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from llmgw.control.store.tables import Base


class UsageRollupRow(Base):
    """Usage summed over one bucket (grain ``m`` minute, ``h`` hour, ``d`` day) per who and what.

    Every request lands in its minute, hour and day row in the same transaction as its journal mark, so
    each grain is exact; each grain has its own retention.
    """

    __tablename__ = "usage_rollups"

    grain: Mapped[str] = mapped_column(String(1), primary_key=True)
    start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the bucket's first second (UTC epoch)
    project: Mapped[str] = mapped_column(String(63), primary_key=True)
    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    model: Mapped[str] = mapped_column(String(253), primary_key=True)
    user: Mapped[str] = mapped_column(String(63), primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    spend_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    ttft_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_count: Mapped[int] = mapped_column(BigInteger, default=0)
    duration_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    #: Requests per time-to-first-token bucket (``core.quota.TTFT_BUCKETS_MS``), for percentiles.
    ttft_hist: Mapped[list[int]] = mapped_column(JSON, default=list)


class UsageRequestRow(Base):
    """One request, in the optional per-request log (off unless its retention is set)."""

    __tablename__ = "usage_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    router: Mapped[str] = mapped_column(String(253), default="")
    project: Mapped[str] = mapped_column(String(63), default="")
    key: Mapped[str] = mapped_column(String(32), default="")
    user: Mapped[str] = mapped_column(String(63), default="")
    model: Mapped[str] = mapped_column(String(253), default="")
    node: Mapped[str] = mapped_column(String(253), default="")
    replica: Mapped[str] = mapped_column(String(253), default="")
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    spend_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[int] = mapped_column(Integer, default=0)
    ttft_ms: Mapped[float] = mapped_column(Float, default=0.0)
    duration_ms: Mapped[float] = mapped_column(Float, default=0.0)


class UsageMarkRow(Base):
    """How far one router journal's records are applied: a record at or below it is never counted again."""

    __tablename__ = "usage_marks"

    journal: Mapped[str] = mapped_column(String(64), primary_key=True)
    router: Mapped[str] = mapped_column(String(253), default="")
    applied_through: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)


class QuotaLedgerRow(Base):
    """One budget in one period (``core.quota.budget_id``): its limit, what was charged, what was crossed."""

    __tablename__ = "quota_ledger"

    budget: Mapped[str] = mapped_column(String(400), primary_key=True)
    limit: Mapped[int] = mapped_column(BigInteger)
    charged: Mapped[int] = mapped_column(BigInteger, default=0)
    period_end: Mapped[float] = mapped_column(Float, index=True)
    #: The thresholds already announced (``core.quota.THRESHOLDS`` as bits), so each is said once a period.
    marks: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)


class QuotaLeaseRow(Base):
    """The part of a budget one router holds and has not yet spent or given back."""

    __tablename__ = "quota_leases"

    budget: Mapped[str] = mapped_column(String(400), primary_key=True)
    router: Mapped[str] = mapped_column(String(253), primary_key=True)
    held: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[float] = mapped_column(Float)
