"""``core.history``: bounded rings of time buckets, downsampled by aggregation, gaps read as gaps."""

from __future__ import annotations

import pytest

from llmgw.core.history import DEFAULT_TIERS, Field, Kind, Series, Tier

FIELDS = (Field("requests", Kind.SUM), Field("in_flight", Kind.MEAN))


def test_size_is_fixed_at_creation_and_never_grows() -> None:
    s = Series(FIELDS)
    before = s.nbytes()
    # 1800 slots x (2 float32 + 1 uint32 count + 1 int64 bucket number)
    assert before == 1800 * (2 * 4 + 4 + 8)
    for t in range(0, 3 * 86400, 7):  # three days of records, every 7 s: more than both rings hold
        s.record(float(t), {"requests": 1, "in_flight": 2})
    assert s.nbytes() == before


def test_fine_tier_sums_counts_and_averages_gauges_per_bucket() -> None:
    s = Series(FIELDS)
    for t, req, fl in ((1000.0, 3, 2.0), (1004.0, 4, 4.0), (1012.0, 5, 9.0)):
        s.record(t, {"requests": req, "in_flight": fl})
    tier, rows = s.read(1015.0, 30.0)
    assert tier == Tier(10, 360)
    assert rows == [(990, None), (1000, (7.0, 3.0)), (1010, (5.0, 9.0))]


def test_coarse_tier_is_the_aggregate_of_the_same_records() -> None:
    s = Series(FIELDS)
    for t in range(600, 720, 5):  # two minutes, a record every 5 s
        s.record(float(t), {"requests": 1, "in_flight": float(t % 60)})
    tier, rows = s.read(719.0, 7200.0)
    assert tier == Tier(60, 1440)
    assert rows[-2:] == [(600, (12.0, 27.5)), (660, (12.0, 27.5))]
    # The fine buckets of the same minute sum to the coarse one: nothing lost or counted twice.
    _, fine = s.read(659.0, 60.0)
    assert sum(r[0] for _, r in fine if r is not None) == 12.0


def test_a_bucket_with_no_record_is_a_gap_and_an_overwritten_slot_does_not_leak() -> None:
    s = Series(FIELDS, tiers=(Tier(10, 6),))  # one minute
    s.record(100.0, {"requests": 1, "in_flight": 1})
    s.record(130.0, {"requests": 2, "in_flight": 1})
    _, rows = s.read(139.0, 60.0)
    assert rows == [(80, None), (90, None), (100, (1.0, 1.0)), (110, None), (120, None), (130, (2.0, 1.0))]
    # 100 s later bucket 10 (t=100) and bucket 16 (t=160) share slot 4: the old value must not show.
    s.record(165.0, {"requests": 7})
    _, rows = s.read(169.0, 60.0)
    assert (160, (7.0, None)) in rows  # a mean with no sample in a seen bucket: None, not 0
    assert all(start != 100 for start, _ in rows)
    assert dict(rows)[130] == (2.0, 1.0)


def test_a_record_older_than_the_ring_is_dropped_not_written_over_a_newer_bucket() -> None:
    s = Series(FIELDS, tiers=(Tier(10, 6),))
    s.record(200.0, {"requests": 5})
    s.record(140.0, {"requests": 100})  # bucket 14 shares slot 2 with bucket 20: too old, dropped
    _, rows = s.read(205.0, 60.0)
    assert dict(rows)[200] == (5.0, None)
    assert sum(r[0] for _, r in rows if r is not None) == 5.0


def test_empty_record_marks_a_known_zero_and_bad_values_are_skipped() -> None:
    s = Series(FIELDS)
    s.record(50.0, {})
    s.record(51.0, {"requests": float("nan"), "in_flight": 3})
    s.record(float("inf"), {"requests": 1})
    _, rows = s.read(55.0, 10.0)
    assert rows == [(50, (0.0, 3.0))]


def test_tier_choice_and_bad_construction() -> None:
    s = Series(FIELDS)
    assert s.tier_for(3600) == DEFAULT_TIERS[0]
    assert s.tier_for(3601) == DEFAULT_TIERS[1]
    assert s.tier_for(10 * 86400) == DEFAULT_TIERS[1]
    _, rows = s.read(86400.0 * 30, 86400.0 * 2)
    assert len(rows) == 1440  # never more buckets than the ring holds
    with pytest.raises(ValueError, match="repeat"):
        Series((Field("a"), Field("a")))
    with pytest.raises(ValueError, match="at least one"):
        Series(())
    with pytest.raises(KeyError):
        s.record(1.0, {"nope": 1})
