"""The store's usage rollups: routers' metered requests applied once, exactly, into minute, hour and day rows.

A ``UsageBatch`` is one router journal's records numbered by ``seq``. ``apply_usage`` takes, in one
transaction, the journal's mark (``UsageMarkRow``, locked), the records above it, their sums into
their minute, hour and day rows, and the mark moved to the highest seq: a batch sent twice, or a
replay overlapping what was stored, counts each record once. Two control planes applying batches of
different journals at once both add to the same rollup rows; those rows are locked (FOR UPDATE on
PostgreSQL, in one order so two batches never deadlock) before they are read and added to. SQLite
takes one writer at a time: the transaction's first statement is a write (the mark's insert), so a
second writer waits for the first instead of failing on a snapshot it read before the first committed.

Unfenced: a standby may be answering a router during a failover, and what it stores is a fact (the
mark makes it exact), not a decision only the leader may take.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from llmgw.api.usage import UsageBatch, UsageRecord
from llmgw.control.store.base import StoreBase
from llmgw.control.store.usagetables import UsageMarkRow, UsageRequestRow, UsageRollupRow
from llmgw.core import quota

#: The grains, each with its bucket's length in seconds (a day is the UTC day: 86400 s from the epoch's).
GRAINS: tuple[tuple[str, int], ...] = (("m", 60), ("h", 3600), ("d", 86400))

log = logging.getLogger(__name__)
T = TypeVar("T")
_PK = ("grain", "start", "project", "key", "model", "user", "node")
_ZERO = dict(requests=0, errors=0, prompt_tokens=0, cached_tokens=0, completion_tokens=0, spend_micros=0,
             ttft_ms_sum=0.0, ttft_count=0, duration_ms_sum=0.0, ttft_hist=[])
#: Rollup rows per statement: 300 rows of 17 values stay under SQLite's 32766 bound variables.
_CHUNK = 300
_RowKey = tuple[str, int, str, str, str, str, str]  # grain, start, project, key, model, user, node


@dataclasses.dataclass(slots=True)
class _Sums:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    spend_micros: int = 0
    ttft_ms_sum: float = 0.0
    ttft_count: int = 0
    duration_ms_sum: float = 0.0
    ttft_hist: list[int] = dataclasses.field(default_factory=list)

    def add(self, r: UsageRecord) -> None:
        self.requests += 1
        self.errors += r.status >= 400
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.completion_tokens += r.completion_tokens
        self.spend_micros += r.spend_micros
        self.duration_ms_sum += r.duration_ms
        if r.ttft_ms > 0:  # 0: no token came (an error, a refusal)
            self.ttft_ms_sum += r.ttft_ms
            self.ttft_count += 1
            if not self.ttft_hist:
                self.ttft_hist = [0] * (len(quota.TTFT_BUCKETS_MS) + 1)
            self.ttft_hist[quota.ttft_bucket(r.ttft_ms)] += 1


def sums_of(records: Iterable[UsageRecord]) -> dict[_RowKey, _Sums]:
    """The records summed per rollup row of every grain: one write per row, not per record."""
    out: dict[_RowKey, _Sums] = {}
    for r in records:
        for grain, length in GRAINS:
            start = int(r.at // length) * length
            key = (grain, start, r.project, r.key, r.model, r.user, r.node)
            out.setdefault(key, _Sums()).add(r)
    return out


def locked_retry(fn: Callable[[], T], *, tries: int = 5) -> T:
    """``fn()`` (one whole transaction), again when SQLite said "database is locked" (its busy timeout ran
    out behind other writers: the CLI, a burst) or PostgreSQL chose it as a deadlock's victim (the rows
    are locked in one order, so this is a safety net). The transaction was rolled back, so running it
    again is exact."""
    for attempt in range(tries):
        try:
            return fn()
        except sa.exc.OperationalError as e:
            if not any(m in str(e.orig) for m in ("database is locked", "deadlock detected")) \
                    or attempt == tries - 1:
                raise
            log.info("a usage or quota transaction is run again: %s", str(e.orig).splitlines()[0])
    raise AssertionError("unreachable")


def _insert(s: Session) -> type[sa.Insert]:
    """The dialect's INSERT, which has ``on_conflict_do_nothing`` on both databases we open."""
    return postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert  # type: ignore[return-value]


class UsageStore(StoreBase):
    """Applies routers' usage batches exactly once; prunes each grain and the request log to its retention."""

    def apply_usage(self, batch: UsageBatch, *, now: float, request_log: bool = False) -> int:
        """Stores the records of ``batch`` above its journal's mark and moves the mark; returns the new mark.

        ``request_log``: also one ``UsageRequestRow`` per record (the optional per-request log).
        """
        return self.apply_usage_records(batch, now=now, request_log=request_log)[0]

    def apply_usage_records(self, batch: UsageBatch, *, now: float,
                            request_log: bool = False) -> tuple[int, list[UsageRecord]]:
        """``apply_usage``, with the records it stored (none of a batch already stored), for metrics."""
        return locked_retry(lambda: self._apply_usage(batch, now, request_log))

    def _apply_usage(self, batch: UsageBatch, now: float, request_log: bool) -> tuple[int, list[UsageRecord]]:
        with self._session.begin() as s:
            insert = _insert(s)
            # First a write: it takes SQLite's write lock, and on PostgreSQL a concurrent first sight of
            # the same journal waits here for the other's commit and then does nothing.
            s.execute(insert(UsageMarkRow).values(journal=batch.journal, router=batch.router_id[:253],
                                                  applied_through=0, updated_at=now)
                      .on_conflict_do_nothing(index_elements=["journal"]))
            mark = s.execute(sa.select(UsageMarkRow).where(UsageMarkRow.journal == batch.journal)
                             .with_for_update()).scalar_one()
            fresh = [r for r in batch.records if r.seq > mark.applied_through]
            if not fresh:
                return mark.applied_through, []
            self._add_rollups(s, insert, sums_of(fresh))
            if request_log:
                s.add_all(UsageRequestRow(at=r.at, router=batch.router_id[:253], project=r.project, key=r.key,
                                          user=r.user, model=r.model, node=r.node, replica=r.replica,
                                          prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens,
                                          completion_tokens=r.completion_tokens, spend_micros=r.spend_micros,
                                          status=r.status, ttft_ms=r.ttft_ms, duration_ms=r.duration_ms)
                          for r in fresh)
            mark.applied_through = max(r.seq for r in fresh)
            mark.router = batch.router_id[:253]
            mark.updated_at = now
            return mark.applied_through, fresh

    @staticmethod
    def _add_rollups(s: Session, insert: type[sa.Insert], sums: dict[_RowKey, _Sums]) -> None:
        """Adds each row's sums: rows made where missing, then locked and added to, a chunk at a time.

        An upsert's arithmetic in SQL cannot add the histogram (a JSON list) on both databases; locked
        first, the read-and-add is exact under concurrency all the same. Sorted, so two batches lock
        the rows they share in one order and never deadlock. Statements per chunk, not per row: a batch
        of 5000 records over 500 keys and models is 1500 rows.
        """
        keys = sorted(sums)
        pk = [getattr(UsageRollupRow, c) for c in _PK]
        chunks = [keys[at:at + _CHUNK] for at in range(0, len(keys), _CHUNK)]
        # Every insert before any lock: a transaction that inserted a high row and then waited to lock a
        # low one another holds, while that other waits to insert the same high row, is a deadlock.
        for chunk in chunks:
            s.execute(insert(UsageRollupRow).on_conflict_do_nothing(),
                      [{**dict(zip(_PK, k, strict=True)), **_ZERO} for k in chunk])
        for chunk in chunks:
            rows = s.scalars(sa.select(UsageRollupRow).where(sa.tuple_(*pk).in_(chunk)).order_by(*pk)
                             .with_for_update())
            for row in rows:
                add = sums[(row.grain, row.start, row.project, row.key, row.model, row.user, row.node)]
                row.requests += add.requests
                row.errors += add.errors
                row.prompt_tokens += add.prompt_tokens
                row.cached_tokens += add.cached_tokens
                row.completion_tokens += add.completion_tokens
                row.spend_micros += add.spend_micros
                row.ttft_ms_sum += add.ttft_ms_sum
                row.ttft_count += add.ttft_count
                row.duration_ms_sum += add.duration_ms_sum
                if add.ttft_hist:
                    row.ttft_hist = quota.add_hist(row.ttft_hist or [], add.ttft_hist)  # a new list: the ORM sees it

    def usage_mark(self, journal: str) -> int:
        """How far a journal's records are stored (0: none yet)."""
        with self._session() as s:
            got = s.execute(sa.select(UsageMarkRow.applied_through)
                            .where(UsageMarkRow.journal == journal)).scalar_one_or_none()
        return int(got or 0)

    def prune_usage(self, *, now: float, minute_retention_s: float, hour_retention_s: float,
                    day_retention_s: float, request_log_retention_s: float, mark_retention_s: float = 0.0) -> int:
        """Deletes rollups older than their grain's retention, and request-log rows older than theirs (0:
        the log is off, so it is emptied); marks of journals silent past ``mark_retention_s`` (0: the day
        grain's retention). How many rows went."""
        gone = 0
        with self._session.begin() as s:
            for grain, retention in (("m", minute_retention_s), ("h", hour_retention_s), ("d", day_retention_s)):
                gone += int(s.execute(sa.delete(UsageRollupRow).where(
                    UsageRollupRow.grain == grain, UsageRollupRow.start < now - retention)).rowcount)
            gone += int(s.execute(sa.delete(UsageRequestRow).where(
                UsageRequestRow.at < now - request_log_retention_s)).rowcount)
            # A mark is what makes a late replay count once: kept as long as the longest rollup is.
            gone += int(s.execute(sa.delete(UsageMarkRow).where(
                UsageMarkRow.updated_at < now - (mark_retention_s or day_retention_s))).rowcount)
        return gone
