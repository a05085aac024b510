"""The UI's server-side SVG charts: well-formed SVG, bars as tall as their values, axes and labels, escaped text,
and nothing a Content-Security-Policy without inline style or script would block."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from llmgw.control.ui import charts

SVG = "{http://www.w3.org/2000/svg}"
PLOT_H = charts.HEIGHT - charts.TOP - charts.BOTTOM


def parse(markup: str) -> ET.Element:
    root = ET.fromstring(str(markup))
    assert root.tag == f"{SVG}svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def no_style_or_script(markup: str) -> None:
    """The CSP (``guard.CSP``) has no 'unsafe-inline': a style attribute or element, or a script, would be blocked."""
    root = parse(markup)
    for el in root.iter():
        assert "style" not in el.attrib and not el.tag.endswith(("style", "script", "foreignObject")), el.tag
        assert not any(k.startswith("on") for k in el.attrib), el.attrib


def test_nice_top_and_compact_numbers() -> None:
    assert [charts.nice_top(x) for x in (0, 0.3, 1, 7, 12, 21, 99, 100, 101, 4_200)] == \
        [1.0, 0.5, 1, 10, 20, 25, 100, 100, 200, 5_000]
    assert [charts.compact(x) for x in (0, 12, 0.25, 1234, 3_400_000, 2e9, 1_000)] == \
        ["0", "12", "0.25", "1.2k", "3.4M", "2G", "1k"]


def test_a_bar_chart_draws_one_bar_per_value_scaled_to_the_axis_with_ticks_and_labels() -> None:
    markup = charts.bar([("12-01", 50), ("12-02", 100), ("12-03", 0)], title="Requests per day")
    no_style_or_script(markup)
    root = parse(markup)
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert [round(float(b.get("height", 0)), 1) for b in bars] == [PLOT_H / 2, PLOT_H]  # 0 draws nothing
    assert float(bars[1].get("y", 0)) == charts.TOP  # the largest reaches the top of a 100 axis
    words = texts(root)
    assert "Requests per day" in words and {"12-01", "12-02", "12-03"} <= set(words)
    assert {"0", "25", "50", "75", "100"} <= set(words)  # the y ticks
    assert root.find(f"{SVG}title") is not None and root.get("role") == "img"
    assert [t.text for t in bars[0].iter(f"{SVG}title")] == ["12-01: 50"]


def test_stacked_bars_stack_each_series_and_name_them_in_a_legend() -> None:
    markup = charts.stacked_bar(["d1", "d2"], {"alpha": [30, 10], "beta": [10, 0]}, title="Tokens")
    no_style_or_script(markup)
    root = parse(markup)
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert len(bars) == 3  # beta's 0 on d2 is not drawn
    a1, b1, a2 = bars
    assert a1.get("fill") == a2.get("fill") != b1.get("fill")
    # alpha sits on the axis, beta on top of it: d1's total (40) is the top of a 50 axis.
    assert float(a1.get("y", 0)) + float(a1.get("height", 0)) == pytest.approx(charts.TOP + PLOT_H, abs=0.1)
    assert float(b1.get("y", 0)) + float(b1.get("height", 0)) == pytest.approx(float(a1.get("y", 0)), abs=0.1)
    assert float(b1.get("y", 0)) == pytest.approx(charts.TOP + PLOT_H * (1 - 40 / 50), abs=0.1)
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"] == ["alpha", "beta"]
    assert [t.text for t in b1.iter(f"{SVG}title")] == ["d1 · beta: 10"]


def test_a_line_goes_through_each_point() -> None:
    markup = charts.line([("a", 100), ("b", 400), ("c", 250)], title="TTFT p90", unit=" ms")
    no_style_or_script(markup)
    root = parse(markup)
    (poly,) = root.iter(f"{SVG}polyline")
    ys = [float(p.split(",")[1]) for p in poly.get("points", "").split()]
    assert ys == pytest.approx([charts.TOP + PLOT_H * (1 - v / 500) for v in (100, 400, 250)], abs=0.1)
    assert len(list(root.iter(f"{SVG}circle"))) == 3
    assert "500 ms" in texts(root)


def test_names_chosen_by_users_are_escaped() -> None:
    """A project or model name with markup in it is text in the chart, never an element or an attribute."""
    evil = '<script>alert(1)</script>"&'
    markup = charts.stacked_bar([evil], {evil: [1.0]}, title=evil)
    assert "<script>" not in markup
    no_style_or_script(markup)
    root = parse(markup)
    assert evil in texts(root) and root.get("aria-label") == evil


def test_no_data_draws_an_empty_chart_that_says_so() -> None:
    for markup in (charts.bar([], title="x"), charts.line([], title="y"), charts.stacked_bar([], {}, title="z")):
        no_style_or_script(markup)
        assert "no data in this window" in texts(parse(markup))


def test_a_series_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="series 'a' has 1 values for 2 labels"):
        charts.stacked_bar(["d1", "d2"], {"a": [1.0]}, title="t")


def test_a_line_leaves_a_gap_where_there_is_no_data() -> None:
    """None is no data (no request that day), not 0: no dot there, and the line is two runs around it."""
    root = parse(charts.line([("a", 100), ("b", 200), ("c", None), ("d", 300), ("e", 50)], title="t"))
    runs = [p.get("points", "").split() for p in root.iter(f"{SVG}polyline")]
    assert [len(r) for r in runs] == [2, 2]
    assert len(list(root.iter(f"{SVG}circle"))) == 4
    lone = parse(charts.line([("a", None), ("b", 5), ("c", None)], title="t"))
    assert list(lone.iter(f"{SVG}polyline")) == [] and len(list(lone.iter(f"{SVG}circle"))) == 1
