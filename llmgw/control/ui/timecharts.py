"""Time-series line charts drawn on the server as inline SVG, for the history of models and nodes (issue 30).

The same choices as ``charts`` (whose frame colours and escaping it shares), for the same reason: the
pages' Content-Security-Policy allows no inline script or style, and SVG presentation attributes need
neither. A chart is one ``<svg>`` with several lines over a time axis whose ticks fall on round times
(every 1, 2, 5, 10, 15, 30 minutes, 1, 2, 3, 6 hours: at most ``MAX_TIME_TICKS``), labelled ``HH:MM`` in
UTC, and a y axis in the values' unit made humane (``core.humane``: GiB for bytes, ``k``/``M`` for
counts). A None value is a gap: the line stops there and starts again after it. Each point carries a
``<title>`` (its line, value and UTC time) for hovering; ``data-points`` on the ``<svg>`` says how many
values it drew, ``data-sum`` the first line's sum and ``data-newest`` the start of its newest bucket above 0
(what a test reads to see the chart grow).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

from markupsafe import Markup

from llmgw.control.ui.charts import AXIS, GRID, PALETTE, TEXT, Y_TICKS, _e
from llmgw.core import humane

WIDTH, HEIGHT = 480, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 26, 44
MAX_TIME_TICKS = 6
#: Round tick spacings, seconds.
TICK_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)


def time_ticks(start: float, end: float) -> list[float]:
    """Round times in [start, end]: the smallest spacing of ``TICK_STEPS`` that gives at most ``MAX_TIME_TICKS``."""
    span = max(end - start, 1.0)
    step = next((s for s in TICK_STEPS if span / s <= MAX_TIME_TICKS), TICK_STEPS[-1])
    first = -(-start // step) * step
    out, t = [], first
    while t <= end:
        out.append(t)
        t += step
    return out


def _clock(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).strftime("%H:%M")


def nice_ticks(largest: float) -> tuple[float, int]:
    """(step, count): the y axis' ticks are 0, step, … count × step ≥ ``largest``, step a 1, 2, 2.5 or 5 × 10^k
    and count at most ``Y_TICKS`` (so labels read 0, 5, 10, 15 ms, never 6.25)."""
    if largest <= 0 or not math.isfinite(largest):
        return 1.0, Y_TICKS
    magnitude = 10 ** math.floor(math.log10(largest / Y_TICKS))
    for m in (1, 2, 2.5, 5, 10, 20):
        step = m * magnitude
        if step * Y_TICKS >= largest * (1 - 1e-12):
            return step, max(1, math.ceil(largest / step - 1e-9))
    return 20 * magnitude, 1  # unreachable


def _scale(unit: str, largest: float) -> tuple[float, int, float, str]:
    """(the tick step in raw units, how many ticks, the divisor the labels use, the labels' unit)."""
    if unit == "B":
        div, name = humane.size_unit(largest)
        step, count = nice_ticks(largest / div)
        return step * div, count, div, f" {name}"
    step, count = nice_ticks(largest)
    return step, count, 1.0, unit


def _label(v: float, div: float, unit: str) -> str:
    return humane.number(v / div) + unit


def time_series(times: Sequence[float], lines: Sequence[tuple[str, Sequence[float | None]]], *, title: str,
                unit: str = "", step_s: float = 10.0, chart_id: str = "") -> Markup:
    """Lines named by ``lines`` ``(name, values)``, a value per time of ``times`` (each a bucket's start),
    drawn at their buckets' middles. ``unit``: ``B`` bytes, ``%``, ``/s``, `` ms``, or "" a count."""
    for name, values in lines:
        if len(values) != len(times):
            raise ValueError(f"line {name!r} has {len(values)} values for {len(times)} times")
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    drawn = sum(1 for _, vs in lines for v in vs if v is not None)
    total = sum(v for _, vs in lines[:1] for v in vs if v is not None)
    newest = max((t for _, vs in lines[:1] for t, v in zip(times, vs, strict=True) if v), default=0)
    largest = max((v for _, vs in lines for v in vs if v is not None), default=0.0)
    tick, ticks, div, shown_unit = _scale(unit, largest)
    top = tick * ticks
    start = times[0] if times else 0.0
    end = (times[-1] + step_s) if times else 1.0
    span = max(end - start, 1e-9)

    def x_of(t: float) -> float:
        return LEFT + pw * (t - start) / span

    def y_of(v: float) -> float:
        return TOP + ph - ph * v / top

    ident = f' id="{_e(chart_id)}"' if chart_id else ""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg"{ident} class="chart timechart" role="img" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
           f'font-size="11" aria-label="{_e(title)}" data-points="{drawn}" data-sum="{total:.3f}" '
           f'data-newest="{newest:.0f}">',
           f"<title>{_e(title)}</title>",
           f'<text x="{LEFT}" y="15" font-size="13" font-weight="bold" fill="{TEXT}">{_e(title)}</text>']
    for i in range(ticks + 1):
        y = TOP + ph - ph * i / ticks
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="{GRID if i else AXIS}"/>')
        out.append(f'<text class="y-label" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{TEXT}">'
                   f"{_e(_label(tick * i, div, shown_unit))}</text>")
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="{AXIS}"/>')
    if times:
        for t in time_ticks(start, end):
            x = x_of(t)
            out.append(f'<line x1="{x:.1f}" y1="{TOP + ph}" x2="{x:.1f}" y2="{TOP + ph + 4}" stroke="{AXIS}"/>')
            out.append(f'<text class="x-label" x="{x:.1f}" y="{TOP + ph + 15}" text-anchor="middle" '
                       f'fill="{TEXT}">{_clock(t)}</text>')
        out.append(f'<text x="{LEFT + pw}" y="{TOP + ph + 15}" text-anchor="end" fill="{AXIS}" font-size="9">'
                   "UTC</text>")
    if not drawn:
        out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{TOP + ph / 2:.1f}" text-anchor="middle" fill="{AXIS}">'
                   "no data in this window yet</text>")
    for k, (name, values) in enumerate(lines):
        colour = PALETTE[k % len(PALETTE)]
        runs: list[list[tuple[float, float]]] = [[]]
        for t, v in zip(times, values, strict=True):
            if v is None:
                if runs[-1]:
                    runs.append([])
                continue
            x, y = x_of(t + step_s / 2), y_of(v)
            runs[-1].append((x, y))
            out.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="1.6" fill="{colour}"><title>'
                       f"{_e(name)}: {_e(humane.value(v, unit) if unit in ('B', 's') else _label(v, 1, unit))}"
                       f" at {_e(humane.utc(t))}</title></circle>")
        for run in runs:
            if len(run) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                out.append(f'<polyline class="line" points="{path}" fill="none" stroke="{colour}" '
                           'stroke-width="1.5"/>')
    lx = LEFT
    for k, (name, _) in enumerate(lines if len(lines) > 1 else ()):  # one line: the title names it
        out.append(f'<rect x="{lx}" y="{HEIGHT - 17}" width="9" height="9" fill="{PALETTE[k % len(PALETTE)]}"/>')
        out.append(f'<text class="legend" x="{lx + 12}" y="{HEIGHT - 9}" fill="{TEXT}">{_e(name)}</text>')
        lx += 22 + 6 * min(len(name), 20)
    out.append("</svg>")
    return Markup("".join(out))
