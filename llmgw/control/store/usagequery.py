"""Reading usage: the rollups summed by project, key, model, user, node, day or hour, in SQL.

The ingest (``usage``) writes each request into its minute, hour and day row of ``usage_rollups``; this
mixin only reads them. A window's precision is the finest grain that its length allows (each grain has its
own retention, so minute rows are not there a month back): minutes for a window of up to 2 hours, hours up
to 7 days, days beyond (``grain_for``). Since a row covers its whole bucket, the window's start is rounded
down to the start of its bucket at that grain (``window``): "the last 30 days" is 30 UTC days and the part
of the day before them that has begun; "the last 7 days" starts at the top of the hour 168 hours ago.
Inside the window, whole hours and days are read from the coarser rows (``spans``): 7 days are the hours
before the first midnight and then 7 day rows per key and model, not 168 hour rows. Each grain is exact
(the ingest writes all three in one transaction), so the sums are the same either way; only fewer rows
are read (a week of 100 keys × 20 models: 60,000 rows instead of 336,000).

Summing is done by the database (GROUP BY, SUM), so the answer's size is the number of groups, not of
rows. TTFT percentiles come from the rows' histograms (``core.quota.TTFT_BUCKETS_MS``), summed per group
and bucket in the same query (a JSON path per bucket, which SQLite and PostgreSQL both take).

Who sees what is the caller's to decide (``projects_visible``: None for everything, else a set of
project names); ``projects_of`` answers it for a user from ``project_members``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from llmgw.control.store.base import StoreBase
from llmgw.control.store.tables import ProjectMemberRow
from llmgw.control.store.usagetables import UsageRollupRow
from llmgw.core import quota

#: What a view groups by: a column of the rollups, or a time bucket.
DIMENSIONS = ("project", "key", "model", "user", "node", "day", "hour")
#: (grain, its bucket in seconds, the longest window read at it).
GRAINS: tuple[tuple[str, int, float], ...] = (("m", 60, 2 * 3600.0), ("h", 3600, 7 * 86400.0),
                                              ("d", 86400, float("inf")))
_BUCKET_S = {"day": 86400, "hour": 3600}
_HIST_LEN = len(quota.TTFT_BUCKETS_MS) + 1


@dataclasses.dataclass(frozen=True, slots=True)
class UsageRow:
    """One group's usage: its value(s) and the sums; ``start`` is the bucket's first second for day/hour."""

    group: str
    requests: int
    errors: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    spend: float  # currency units (micros / 1e6)
    ttft_p50_ms: float
    ttft_p90_ms: float
    duration_ms_mean: float
    start: int | None = None
    #: The second dimension's value in a time series (``time_series``' ``group_by``); "" otherwise.
    series: str = ""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclasses.dataclass(frozen=True, slots=True)
class UsageView:
    """A view's answer: the window actually read (``since`` rounded down to its grain), the grain, the rows."""

    since: int
    until: float
    grain: str
    rows: list[UsageRow]


#: How far past a grain's longest window a window may run and still be read at that grain: "7d" asked for
#: is ``now - 7 d`` computed a moment before the store's ``now``, and must not fall to day rows for it.
SLACK_S = 60.0


def grain_for(since: float, until: float) -> tuple[str, int]:
    """The grain a window ``[since, until)`` is read at (its length within ``SLACK_S`` of the limit counts as
    within it), and its bucket in seconds."""
    for grain, step, longest in GRAINS:
        if until - since <= longest + SLACK_S:
            return grain, step
    raise AssertionError("the last grain takes any window")


def window(since: float, until: float) -> tuple[str, int]:
    """The grain, and ``since`` rounded down to the start of its bucket at that grain (UTC)."""
    grain, step = grain_for(since, until)
    return grain, int(since) // step * step


def spans(grain: str, start: int, until: float, *, now: float, finest: int = 86400) -> list[tuple[str, int, float]]:
    """The rows that read ``[start, until)`` at ``grain``'s precision: ``(grain, from, to)`` ranges of bucket
    starts, coarser rows wherever whole coarser buckets fit (up to buckets of ``finest`` seconds, the time
    grouping's), so a week is 7 day rows per key and model, not 168 hour rows, plus the hours before the first
    whole day. A coarser bucket that holds ``until`` counts whole when ``until`` is now (within ``SLACK_S``:
    nothing is stored after now), else its part is read at the finer grain."""
    level = next(i for i, g in enumerate(GRAINS) if g[0] == grain)
    if level + 1 == len(GRAINS) or GRAINS[level + 1][1] > finest:
        return [(grain, start, until)]
    step = GRAINS[level + 1][1]
    first = -(-start // step) * step
    last = -(-int(until) // step) * step if until >= now - SLACK_S else int(until) // step * step
    if first >= last:
        return [(grain, start, until)]
    head = [(grain, start, float(first))] if start < first else []
    tail = [(grain, last, until)] if last < until else []
    return head + spans(GRAINS[level + 1][0], first, float(last), now=now, finest=finest) + tail


def _day(start: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(start))


def _hour(start: int) -> str:
    return time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(start))


class UsageQueryStore(StoreBase):
    """Read-only views over ``usage_rollups`` and who belongs to which project."""

    def projects_of(self, user: str) -> set[str]:
        """The projects ``user`` has a role in (owner, member or viewer)."""
        with self._session() as s:
            return set(s.scalars(sa.select(ProjectMemberRow.project).where(ProjectMemberRow.user == user)))

    def usage(self, since: float, until: float | None = None, by: str = "project", *, project: str = "",
              key: str = "", model: str = "", projects_visible: set[str] | None = None,
              now: float | None = None) -> UsageView:
        """Usage in ``[since, until)`` (until: now) grouped by ``by`` (a ``DIMENSIONS`` member), largest first
        for a column, oldest first for day/hour. A bucket that starts before ``until`` is read whole.

        ``since`` is rounded down to the start of its minute (window ≤ 2 h), hour (≤ 7 d) or UTC day (longer):
        the grain read (``window``); whole hours and days inside the window are read from hour and day rows
        (``spans``). ``project``/``key``/``model`` filter ("" : all); ``projects_visible`` None reads every
        project, a set only those (an empty set: nothing). ``now``: the clock (tests).
        """
        now = time.time() if now is None else now
        until = now if until is None else until
        return self._view(since, until, (by,), project=project, key=key, model=model, visible=projects_visible,
                          now=now)

    def time_series(self, since: float, until: float | None = None, bucket: str = "day", group_by: str = "",
                    *, project: str = "", key: str = "", model: str = "",
                    projects_visible: set[str] | None = None, now: float | None = None) -> UsageView:
        """Usage per ``bucket`` (day or hour) and, with ``group_by``, per that column too (``UsageRow.series``):
        what the charts draw. Rows oldest first; the window and grain as ``usage``'s. An hour bucket over a
        window read at day grain is the day's first hour (the rows know no finer time)."""
        if bucket not in _BUCKET_S:
            raise ValueError(f"bucket {bucket!r}: expected day or hour")
        now = time.time() if now is None else now
        until = now if until is None else until
        dims = (bucket, group_by) if group_by else (bucket,)
        return self._view(since, until, dims, project=project, key=key, model=model, visible=projects_visible,
                          now=now)

    # -- the query -----------------------------------------------------------------
    def _view(self, since: float, until: float, dims: Sequence[str], *, project: str, key: str, model: str,
              visible: set[str] | None, now: float) -> UsageView:
        for d in dims:
            if d not in DIMENSIONS:
                raise ValueError(f"by {d!r}: expected one of {', '.join(DIMENSIONS)}")
        grain, start = window(since, until)
        if visible is not None and not visible:
            return UsageView(start, until, grain, [])
        r = UsageRollupRow
        finest = min((_BUCKET_S[d] for d in dims if d in _BUCKET_S), default=86400)
        parts = spans(grain, start, until, now=now, finest=finest)
        where = [sa.or_(*(sa.and_(r.grain == g, r.start >= lo, r.start < hi) for g, lo, hi in parts))]
        for column, value in ((r.project, project), (r.key, key), (r.model, model)):
            if value:
                where.append(column == value)
        if visible is not None:
            where.append(r.project.in_(sorted(visible)))
        groups = [self._dim(d) for d in dims]
        # The histogram is summed bucket by bucket in the same pass (a JSON path per bucket): 100 ms for 60,000
        # day rows here, where expanding each row's array (json_each) and grouping again took 370 ms.
        hist = [sa.func.sum(r.ttft_hist[i].as_integer()) for i in range(_HIST_LEN)]
        sums = sa.select(*groups, sa.func.sum(r.requests), sa.func.sum(r.errors), sa.func.sum(r.prompt_tokens),
                         sa.func.sum(r.cached_tokens), sa.func.sum(r.completion_tokens), sa.func.sum(r.spend_micros),
                         sa.func.sum(r.duration_ms_sum), *hist).where(*where).group_by(*groups)
        with self._session() as s:
            summed = s.execute(sums).all()
        n = len(dims)
        rows = [self._row(dims, tuple(g[:n]), g[n:n + 7], [int(h or 0) for h in g[n + 7:]]) for g in summed]
        if dims[0] in _BUCKET_S:
            rows.sort(key=lambda u: (u.start or 0, u.series))
        else:
            rows.sort(key=lambda u: (-u.total_tokens, -u.requests, u.group))
        return UsageView(start, until, grain, rows)

    @staticmethod
    def _dim(d: str) -> Any:
        if d in _BUCKET_S:
            step = _BUCKET_S[d]
            # Literal numbers, not bound ones: PostgreSQL matches the GROUP BY to the SELECT's expression only
            # when they are the same text, and two binds of one number are two parameters ($1, $3).
            size = sa.literal_column(str(step), sa.BigInteger)
            return ((UsageRollupRow.start // size) * size).label(d)
        return getattr(UsageRollupRow, d).label(d)

    @staticmethod
    def _row(dims: Sequence[str], group: tuple[Any, ...], sums: Sequence[Any], hist: list[int]) -> UsageRow:
        requests, errors, prompt, cached, completion, micros, duration = (s or 0 for s in sums)
        start = int(group[0]) if dims[0] in _BUCKET_S else None
        label = (_day if dims[0] == "day" else _hour)(start) if start is not None else str(group[0])
        return UsageRow(group=label, requests=int(requests), errors=int(errors), prompt_tokens=int(prompt),
                        cached_tokens=int(cached), completion_tokens=int(completion), spend=int(micros) / quota.MICROS,
                        ttft_p50_ms=float(quota.hist_percentile(hist, 50)),
                        ttft_p90_ms=float(quota.hist_percentile(hist, 90)),
                        duration_ms_mean=float(duration) / int(requests) if requests else 0.0, start=start,
                        series=str(group[1]) if len(group) > 1 else "")


def totals(rows: Iterable[UsageRow]) -> dict[str, float]:
    """The sums of ``rows`` (percentiles do not add, so they are left out)."""
    out = {"requests": 0.0, "errors": 0.0, "prompt_tokens": 0.0, "cached_tokens": 0.0, "completion_tokens": 0.0,
           "spend": 0.0}
    for u in rows:
        for k in out:
            out[k] += getattr(u, k)
    return out
