"""``ui.timecharts``: several lines over a UTC time axis with round ticks, humane y labels, gaps, escaping."""

from __future__ import annotations

import re

import pytest

from llmgw.control.ui import timecharts
from llmgw.control.ui.models_page import readable_spec
from llmgw.core import units

T0 = 1_764_921_600  # 2025-12-05 08:00:00 UTC


def test_time_ticks_fall_on_round_times_and_are_few() -> None:
    assert timecharts.time_ticks(T0 - 3600 + 7, T0 + 7) == [T0 - 3000 + 600 * i for i in range(6)]
    assert timecharts.time_ticks(T0 - 300, T0) == [T0 - 300 + 60 * i for i in range(6)]
    day = timecharts.time_ticks(T0 - 86400, T0)
    assert len(day) <= timecharts.MAX_TIME_TICKS and all(t % 14400 == 0 or t % 21600 == 0 for t in day)


@pytest.mark.parametrize(("largest", "step", "count"), [(1.9, 0.5, 4), (21, 10, 3), (100, 25, 4), (7, 2, 4),
                                                        (0.3, 0.1, 3), (0, 1.0, 4)])
def test_y_ticks_are_round_steps(largest: float, step: float, count: int) -> None:
    got_step, got_count = timecharts.nice_ticks(largest)
    assert got_step == pytest.approx(step) and got_count == count


def test_a_chart_draws_each_line_with_gaps_humane_labels_and_hover_times() -> None:
    times = [T0 + 10 * i for i in range(6)]
    svg = str(timecharts.time_series(times, [("used", [1 << 30, 2 << 30, None, None, 3 << 30, 3 << 30]),
                                             ("<b>x</b>", [None] * 6)], title="Memory", unit="B", step_s=10,
                                     chart_id="c1"))
    assert 'id="c1"' in svg and 'data-points="4"' in svg and f'data-sum="{float(9 << 30):.3f}"' in svg
    assert f'data-newest="{T0 + 50}"' in svg
    assert svg.count("<polyline") == 2  # the gap splits the line in two runs
    assert re.findall(r'class="y-label"[^>]*>([^<]+)<', svg) == ["0 GiB", "1 GiB", "2 GiB", "3 GiB"]
    assert "08:00" in svg and "UTC" in svg
    assert "used: 2 GiB at 2025-12-05 08:00:10 UTC" in svg
    assert "<b>x</b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg  # names are users': escaped


def test_an_empty_chart_says_so_and_mismatched_lengths_are_refused() -> None:
    svg = str(timecharts.time_series([T0], [("a", [None])], title="Requests", unit="/s"))
    assert "no data in this window yet" in svg and 'data-points="0"' in svg
    with pytest.raises(ValueError, match="2 values for 1 times"):
        timecharts.time_series([T0], [("a", [1.0, 2.0])], title="t")


def test_the_spec_view_shows_sizes_and_durations_as_a_model_file_writes_them_exactly() -> None:
    spec = {"resources": {"memory": 536870912, "gpus": {"count": 1, "memory": 80 << 30}}, "startup_timeout": 300.0,
            "autoscale": {"scale_up_after": 90.0, "scale_down_after": 0.25, "cold_start_timeout": 1.5}}
    shown = readable_spec(spec)
    assert shown["resources"] == {"memory": "512MiB", "gpus": {"count": 1, "memory": "80GiB"}}
    assert shown["startup_timeout"] == "5m"
    assert shown["autoscale"] == {"scale_up_after": "1m30s", "scale_down_after": "250ms", "cold_start_timeout": 1.5}
    assert spec["resources"]["memory"] == 536870912  # a copy
    # What the editor shows applies back to the same numbers.
    assert units.parse_bytes(shown["resources"]["memory"]) == 536870912
    assert units.parse_duration(shown["autoscale"]["scale_up_after"]) == 90.0
    assert readable_spec({"resources": {"memory": 536870913}})["resources"]["memory"] == 536870913
