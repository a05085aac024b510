"""``core.humane``: the UI's and the CLI's one way to write sizes, durations and times."""

from __future__ import annotations

import pytest

from llmgw.core import humane

NOW = 1_764_921_600.0  # 2025-12-05 08:00:00 UTC


@pytest.mark.parametrize(("n", "text"), [
    (536870912, "512 MiB"), (1610612736, "1.5 GiB"), (900, "900 B"), (0, "0 B"), (1024, "1 KiB"),
    (80 << 30, "80 GiB"), (3 << 40, "3 TiB"), (None, "-"), ("12", "-"), (float("nan"), "-"), (True, "-")])
def test_sizes_read_in_binary_units(n: object, text: str) -> None:
    assert humane.size(n) == text


@pytest.mark.parametrize(("s", "text"), [
    (300.0, "5m"), (90, "1m30s"), (3600, "1h"), (3660, "1h1m"), (93784, "1d2h"), (2.5, "2.5s"), (0.25, "250ms"),
    (0, "0s"), (59.96, "60s"), (-120, "-2m"), (None, "-")])
def test_durations_use_the_largest_units_at_most_two(s: object, text: str) -> None:
    assert humane.duration(s) == text


def test_times_are_relative_with_the_absolute_utc_time_to_hover() -> None:
    assert humane.ago(NOW - 180, NOW) == "3m ago"
    assert humane.ago(NOW - 42, NOW) == "42s ago"
    assert humane.ago(NOW - 7300, NOW) == "2h ago"
    assert humane.ago(NOW - 5 * 86400, NOW) == "5d ago"
    assert humane.ago(NOW + 200, NOW) == "in 3m"
    assert humane.ago(NOW - 0.2, NOW) == "just now"
    assert humane.ago(0, NOW) == humane.ago(None, NOW) == "-"  # the API's "never"
    assert humane.utc(NOW) == "2025-12-05 08:00:00 UTC"
    assert humane.iso(NOW) == "2025-12-05T08:00:00Z"
    assert humane.utc(0) == "-" and humane.iso(None) == ""


def test_numbers_and_values_by_unit() -> None:
    assert [humane.number(x) for x in (1234, 3_400_000, 0.25, 12, 12.0, 1e13)] == [
        "1.2k", "3.4M", "0.25", "12", "12", "10T"]
    assert humane.value(2 << 30, "B") == "2 GiB"
    assert humane.value(300, "s") == "5m"
    assert humane.value(37.5, "%") == "37.5%"
    assert humane.value(4.2, "/s") == "4.2/s"
    assert humane.value(None, " ms") == "-"
