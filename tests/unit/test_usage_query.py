"""The usage views over a real SQLite store, rows put straight into ``usage_rollups``: exact sums per grouping,
the grain each window reads, the window's rounding, the filters and who sees which project."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.control.store import usagequery
from llmgw.control.store.store import Store
from llmgw.control.store.tables import ProjectMemberRow
from llmgw.control.store.usagetables import UsageRollupRow
from llmgw.core import quota

DAY, HOUR = 86400, 3600
#: A fixed "now": 2026-12-04 12:30:00 UTC.
NOW = 1796387400.0
TODAY = int(NOW) // DAY * DAY
HIST_LEN = len(quota.TTFT_BUCKETS_MS) + 1


def hist(**at: int) -> list[int]:
    """A TTFT histogram with ``n`` requests in the bucket whose edge is ``ms``: ``hist(b25=3)``."""
    h = [0] * HIST_LEN
    for name, n in at.items():
        h[quota.TTFT_BUCKETS_MS.index(int(name[1:]))] += n
    return h


def put(store: Store, grain: str, start: int, project: str, key: str = "k1", model: str = "m1", user: str = "",
        node: str = "n1", **sums: Any) -> None:
    row = {"requests": 1, "errors": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0,
           "spend_micros": 0, "ttft_ms_sum": 0.0, "ttft_count": 0, "duration_ms_sum": 0.0, "ttft_hist": [], **sums}
    with store._session.begin() as s:
        s.add(UsageRollupRow(grain=grain, start=start, project=project, key=key, model=model, user=user, node=node,
                             **row))


def meter(store: Store, requests: list[tuple[float, str, str, int, int]]) -> None:
    """Each ``(at, project, model, prompt_tokens, ttft_ms)`` request added to its minute, hour and day rows, as
    the ingest writes them (one key per project)."""
    rows: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    for at, project, model, prompt, ttft in requests:
        for grain, step in (("m", 60), ("h", HOUR), ("d", DAY)):
            r = rows.setdefault((grain, int(at) // step * step, project, model), {
                "requests": 0, "prompt_tokens": 0, "ttft_count": 0, "ttft_hist": [0] * HIST_LEN})
            r["requests"] += 1
            r["prompt_tokens"] += prompt
            r["ttft_count"] += 1
            r["ttft_hist"][quota.ttft_bucket(ttft)] += 1
    with store._session.begin() as s:
        s.add_all([UsageRollupRow(grain=g, start=start, project=p, key=f"key-{p}", model=m, user="", node="n1",
                                  **sums) for (g, start, p, m), sums in rows.items()])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path)
    try:
        yield s
    finally:
        s.close()


def test_an_hour_is_read_from_minute_rows_and_summed_exactly_per_each_grouping(store: Store) -> None:
    """Two projects' minute rows in the last hour are summed per project, key, model, user and node; the hour
    and day rows (other numbers on purpose) are not read, nor a minute row before the window."""
    minute = int(NOW) // 60 * 60
    put(store, "m", minute - 120, "a", key="k1", model="m1", user="ann", node="n1", requests=3, errors=1,
        prompt_tokens=100, cached_tokens=40, completion_tokens=20, spend_micros=1_250_000, duration_ms_sum=300.0,
        ttft_count=3, ttft_hist=hist(b25=2, b100=1))
    put(store, "m", minute - 60, "a", key="k2", model="m2", user="bob", node="n2", requests=1, prompt_tokens=7,
        completion_tokens=3, spend_micros=10, duration_ms_sum=50.0, ttft_count=1, ttft_hist=hist(b500=1))
    put(store, "m", minute, "b", key="k3", model="m1", user="ann", node="n1", requests=2, errors=2, prompt_tokens=5,
        duration_ms_sum=10.0)
    put(store, "m", minute - 2 * HOUR, "a", requests=1000, prompt_tokens=1000)  # before the window
    put(store, "h", minute // HOUR * HOUR, "a", requests=999, prompt_tokens=999)
    put(store, "d", TODAY, "a", requests=999, prompt_tokens=999)

    v = store.usage(NOW - HOUR, NOW + 1, "project")
    assert v.grain == "m" and v.since == int(NOW - HOUR) // 60 * 60
    a, b = v.rows
    assert (a.group, a.requests, a.errors, a.prompt_tokens, a.cached_tokens, a.completion_tokens) == \
        ("a", 4, 1, 107, 40, 23)
    assert a.spend == 1.25001 and a.duration_ms_mean == 350.0 / 4 and a.total_tokens == 130
    assert (a.ttft_p50_ms, a.ttft_p90_ms) == (25.0, 500.0)  # 4 first tokens: 25, 25, 100, 500
    assert (b.group, b.requests, b.errors, b.prompt_tokens, b.ttft_p90_ms) == ("b", 2, 2, 5, 0.0)

    def sums(by: str) -> dict[str, tuple[int, int]]:
        return {u.group: (u.requests, u.prompt_tokens) for u in store.usage(NOW - HOUR, NOW + 1, by).rows}

    assert sums("key") == {"k1": (3, 100), "k2": (1, 7), "k3": (2, 5)}
    assert sums("model") == {"m1": (5, 105), "m2": (1, 7)}
    assert sums("user") == {"ann": (5, 105), "bob": (1, 7)}
    assert sums("node") == {"n1": (5, 105), "n2": (1, 7)}
    assert sums("day") == {"2026-12-04": (6, 112)}


def test_the_grain_follows_the_window_and_since_is_rounded_down_to_its_bucket() -> None:
    """Minute rows up to 2 h, hour rows up to 7 days, day rows beyond; ``since`` to the bucket's start (UTC)."""
    assert usagequery.grain_for(NOW - 2 * HOUR, NOW) == ("m", 60)
    assert usagequery.grain_for(NOW - 2 * HOUR - 59, NOW) == ("m", 60)  # "2h" computed a moment before now
    assert usagequery.grain_for(NOW - 2 * HOUR - 61, NOW) == ("h", HOUR)
    assert usagequery.grain_for(NOW - 7 * DAY - 59, NOW) == ("h", HOUR)
    assert usagequery.grain_for(NOW - 7 * DAY - 61, NOW) == ("d", DAY)
    assert usagequery.window(NOW - 30 * DAY, NOW) == ("d", TODAY - 30 * DAY)
    assert usagequery.window(NOW - DAY, NOW) == ("h", int(NOW - DAY) // HOUR * HOUR)
    assert usagequery.window(NOW - 90, NOW) == ("m", int(NOW - 90) // 60 * 60)


def test_thirty_days_read_day_rows_from_the_first_whole_day_and_until_is_exclusive(store: Store) -> None:
    """A 30-day window reads day rows from the start of the day 30 days ago (rounded down), not the day before
    it; ``until`` is exclusive: a bucket starting at it is not read, one starting before it is, whole."""
    meter(store, [(TODAY + day * DAY + 12 * HOUR, "a", "m1", day + 100, 20) for day in range(-31, 0)]
          + [(TODAY + HOUR, "a", "m1", 1, 20)])
    v = store.usage(NOW - 30 * DAY, NOW, "day", now=NOW)
    assert v.grain == "d" and [u.start for u in v.rows] == [TODAY + d * DAY for d in range(-30, 1)]
    assert sum(u.requests for u in v.rows) == 31 and v.rows[0].prompt_tokens == 70
    assert store.usage(NOW - 30 * DAY, TODAY, "project", now=NOW).rows[0].requests == 30
    assert store.usage(NOW - 30 * DAY, TODAY + 1, "project", now=NOW).rows[0].requests == 31  # a bucket cut counts


def test_whole_hours_and_days_inside_the_window_are_read_from_coarser_rows() -> None:
    """The ranges read: finer rows up to the first whole coarser bucket, coarser rows while whole ones fit,
    finer rows after the last; the bucket holding ``until`` counts whole when ``until`` is now."""
    start = int(NOW - 7 * DAY) // HOUR * HOUR  # 2026-11-27 12:00
    assert usagequery.spans("h", start, NOW, now=NOW) == [("h", start, TODAY - 6 * DAY),
                                                          ("d", TODAY - 6 * DAY, TODAY + DAY)]
    assert usagequery.spans("h", start, NOW, now=NOW + DAY) == [
        ("h", start, TODAY - 6 * DAY), ("d", TODAY - 6 * DAY, TODAY), ("h", TODAY, NOW)]
    assert usagequery.spans("h", start, NOW, now=NOW, finest=HOUR) == [("h", start, NOW)]  # per hour: hour rows
    m = int(NOW - HOUR - 600) // 60 * 60  # 11:20 to 12:30, read at minutes: 11:20-12:00 and the hour 12:00
    assert usagequery.spans("m", m, NOW, now=NOW) == [("m", m, TODAY + 12 * HOUR),
                                                      ("h", TODAY + 12 * HOUR, TODAY + 13 * HOUR)]
    assert usagequery.spans("m", m, NOW - 1800, now=NOW) == [("m", m, NOW - 1800)]  # no whole hour inside
    assert usagequery.spans("d", TODAY - 30 * DAY, NOW, now=NOW) == [("d", TODAY - 30 * DAY, NOW)]


def test_a_week_read_from_hour_and_day_rows_sums_what_hour_rows_alone_sum(store: Store) -> None:
    """Requests every 37 minutes over 10 days: the 7-day view (hours before the first midnight, then days)
    equals the sum of the requests in its window at hour precision, per model, TTFT percentiles included."""
    requests = [(NOW - i * 37 * 60, "a" if i % 3 else "b", f"m{i % 4}", i % 50, 10 * (i % 40)) for i in range(390)]
    meter(store, requests)
    v = store.usage(NOW - 7 * DAY, NOW + 1, "model", now=NOW + 1)
    start = int(NOW - 7 * DAY) // HOUR * HOUR
    assert v.grain == "h" and v.since == start
    inside = [r for r in requests if start <= r[0] < NOW + 1]
    assert 0 < len(inside) < len(requests)
    for u in v.rows:
        mine = [r for r in inside if r[2] == u.group]
        hist = [0] * HIST_LEN
        for r in mine:
            hist[quota.ttft_bucket(r[4])] += 1
        assert (u.requests, u.prompt_tokens) == (len(mine), sum(r[3] for r in mine))
        assert (u.ttft_p50_ms, u.ttft_p90_ms) == (quota.hist_percentile(hist, 50), quota.hist_percentile(hist, 90))
    assert sum(u.requests for u in v.rows) == len(inside)
    per_day = store.time_series(NOW - 7 * DAY, NOW + 1, "day", now=NOW + 1)
    per_hour = store.time_series(NOW - 7 * DAY, NOW + 1, "hour", now=NOW + 1)
    assert sum(u.requests for u in per_day.rows) == sum(u.requests for u in per_hour.rows) == len(inside)


def test_filters_and_the_visible_projects_narrow_what_is_summed(store: Store) -> None:
    """``project``/``key``/``model`` filter; ``projects_visible`` keeps its projects only, an empty set none."""
    start = int(NOW) // HOUR * HOUR
    put(store, "h", start, "a", key="k1", model="m1", requests=1)
    put(store, "h", start, "a", key="k2", model="m2", requests=2)
    put(store, "h", start, "b", key="k3", model="m1", requests=4)
    put(store, "h", start, "c", key="k4", model="m1", requests=8)

    def groups(**kw: Any) -> dict[str, int]:
        by = kw.pop("by", "project")
        return {u.group: u.requests for u in store.usage(NOW - DAY, NOW + 1, by, **kw).rows}

    assert groups() == {"a": 3, "b": 4, "c": 8}
    assert groups(project="a") == {"a": 3}
    assert groups(key="k2") == {"a": 2}
    assert groups(model="m1", by="model") == {"m1": 13}
    assert groups(projects_visible={"a", "b"}) == {"a": 3, "b": 4}
    assert groups(projects_visible={"a"}, by="model") == {"m1": 1, "m2": 2}
    assert groups(projects_visible={"a"}, project="c") == {}
    assert groups(projects_visible=set()) == {}
    with pytest.raises(ValueError, match="by 'colour'"):
        store.usage(NOW - DAY, NOW, "colour")


def test_time_series_per_day_and_project_merges_each_days_histograms(store: Store) -> None:
    """Per day and per project, oldest first; each bucket's TTFT p90 comes from its rows' merged histograms."""
    meter(store, [(TODAY - 2 * DAY + HOUR, "a", "m1", 10, 40)] + [(TODAY - 2 * DAY + 2 * HOUR, "a", "m2", 10, 200)] * 9
          + [(TODAY - 2 * DAY + HOUR, "b", "m1", 10, 5)] * 2 + [(TODAY + HOUR, "a", "m1", 10, 900)] * 4)
    v = store.time_series(NOW - 3 * DAY, NOW + 1, "day", "project", now=NOW + 1)
    assert v.grain == "h"
    assert [(u.group, u.series, u.requests, u.prompt_tokens, u.ttft_p90_ms) for u in v.rows] == [
        ("2026-12-02", "a", 10, 100, 250.0), ("2026-12-02", "b", 2, 20, 10.0), ("2026-12-04", "a", 4, 40, 1000.0)]
    hourly = store.time_series(NOW - DAY, NOW + 1, "hour", now=NOW + 1)
    assert [(u.group, u.requests) for u in hourly.rows] == [("2026-12-04T01:00Z", 4)]
    with pytest.raises(ValueError, match="bucket"):
        store.time_series(NOW - DAY, NOW, "week")


def test_projects_of_lists_the_users_projects_whatever_the_role(store: Store) -> None:
    with store._session.begin() as s:
        s.add_all([ProjectMemberRow(project="a", user="ann", role="owner"),
                   ProjectMemberRow(project="b", user="ann", role="viewer"),
                   ProjectMemberRow(project="b", user="bob", role="member")])
    assert store.projects_of("ann") == {"a", "b"}
    assert store.projects_of("bob") == {"b"}
    assert store.projects_of("nobody") == set()
