"""Charts drawn on the server as inline SVG: bars, stacked bars and a line, with axes, ticks and labels.

Why on the server: the pages run under a Content-Security-Policy without inline script or style (``guard``)
and load nothing from elsewhere, and a chart library would be the largest thing the UI ships. A chart here
is a few dozen SVG elements built from the numbers, styled only with presentation attributes (``fill``,
``stroke``: not CSS, so the CSP allows them), and every text in it (labels, series names, the title) is
escaped, since series names are project and model names that users choose.

Each function returns ``Markup`` (safe to put in a template as it is) and draws an empty chart with a
"no data" note when given nothing. The y axis starts at 0 and ends at a round number above the largest
value (``nice_top``); x labels are thinned so that at most ``MAX_X_LABELS`` show.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

from markupsafe import Markup

WIDTH, HEIGHT = 640, 240
#: The plot's margins: left (y labels), right, top (title), bottom (x labels and the legend).
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 28, 56
MAX_X_LABELS = 10
Y_TICKS = 4
#: Colours for series, in order (then again): distinguishable, and readable on white.
PALETTE = ("#3b6fb6", "#e0813a", "#4a9d5b", "#c2474f", "#8465b0", "#8c6d4f", "#d17bb8", "#6f7f8f",
           "#b3a632", "#3aa6b8")
TEXT = "#333"
AXIS = "#888"
GRID = "#e4e4e4"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def compact(x: float) -> str:
    """1234 → ``1.2k``, 3_400_000 → ``3.4M``; small numbers as they are (``0.25``, ``12``)."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def nice_top(largest: float) -> float:
    """The y axis' top: the smallest 1, 2, 2.5 or 5 × 10^k that is at least ``largest`` (1 for nothing)."""
    if largest <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(largest))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= largest * (1 - 1e-12):
            return m * magnitude
    return 10 * magnitude


def _frame(title: str, top: float, labels: Sequence[str], unit: str) -> list[str]:
    """The SVG's opening, title, grid, y ticks and thinned x labels (at the centres of ``len(labels)`` slots)."""
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11" aria-label="{_e(title)}">',
           f"<title>{_e(title)}</title>",
           f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold" fill="{TEXT}">{_e(title)}</text>']
    for i in range(Y_TICKS + 1):
        value = top * i / Y_TICKS
        y = TOP + ph - ph * i / Y_TICKS
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="{GRID if i else AXIS}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{TEXT}">'
                   f"{_e(compact(value) + unit)}</text>")
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="{AXIS}"/>')
    every = max(1, math.ceil(len(labels) / MAX_X_LABELS))
    slot = pw / max(1, len(labels))
    for i, label in enumerate(labels):
        if i % every:
            continue
        x = LEFT + slot * (i + 0.5)
        out.append(f'<text class="x-label" x="{x:.1f}" y="{TOP + ph + 14}" text-anchor="middle" fill="{TEXT}">'
                   f"{_e(label)}</text>")
    if not labels:
        out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{TOP + ph / 2:.1f}" text-anchor="middle" fill="{AXIS}">'
                   "no data in this window</text>")
    return out


def _legend(names: Sequence[str]) -> list[str]:
    out, x = [], LEFT
    y = HEIGHT - 14
    for i, name in enumerate(names):
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text class="legend" x="{x + 14}" y="{y}" fill="{TEXT}">{_e(name)}</text>')
        x += 24 + 7 * min(len(name), 24)
        if x > WIDTH - 60:
            break
    return out


def stacked_bar(labels: Sequence[str], series: Mapping[str, Sequence[float]], *, title: str,
                unit: str = "") -> Markup:
    """One bar per label, each split into the series' values in order (a legend names them).

    ``series`` maps a name to one value per label. A bar's tooltip (``<title>``) says its label, series and value.
    """
    names = list(series)
    for name in names:
        if len(series[name]) != len(labels):
            raise ValueError(f"series {name!r} has {len(series[name])} values for {len(labels)} labels")
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    top = nice_top(max(totals, default=0.0))
    out = _frame(title, top, labels, unit)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = pw / max(1, len(labels))
    width = max(1.0, slot * 0.7)
    for i, label in enumerate(labels):
        x, base = LEFT + slot * i + (slot - width) / 2, float(TOP + ph)
        for k, name in enumerate(names):
            value = series[name][i]
            if value <= 0:
                continue
            h = ph * value / top
            base -= h
            out.append(f'<rect class="bar" x="{x:.1f}" y="{base:.1f}" width="{width:.1f}" height="{h:.1f}" '
                       f'fill="{PALETTE[k % len(PALETTE)]}"><title>{_e(label)}{" · " + _e(name) if name else ""}: '
                       f"{_e(compact(value) + unit)}</title></rect>")
    if len(names) > 1 or (names and names[0]):
        out += _legend(names)
    out.append("</svg>")
    return Markup("".join(out))


def bar(points: Sequence[tuple[str, float]], *, title: str, unit: str = "") -> Markup:
    """One bar per ``(label, value)``."""
    return stacked_bar([p[0] for p in points], {"": [p[1] for p in points]}, title=title, unit=unit)


def line(points: Sequence[tuple[str, float | None]], *, title: str, unit: str = "") -> Markup:
    """A line through ``(label, value)`` points, a dot at each (its tooltip says the value); a None value (no
    data there, which is not 0) leaves a gap: the line stops before it and starts again after it."""
    labels = [p[0] for p in points]
    top = nice_top(max((p[1] for p in points if p[1] is not None), default=0.0))
    out = _frame(title, top, labels, unit)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = pw / max(1, len(points))
    runs: list[list[tuple[float, float]]] = [[]]
    for i, (label, value) in enumerate(points):
        if value is None:
            runs.append([])
            continue
        x, y = LEFT + slot * (i + 0.5), TOP + ph - ph * value / top
        runs[-1].append((x, y))
        out.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{PALETTE[0]}"><title>{_e(label)}: '
                   f"{_e(compact(value) + unit)}</title></circle>")
    for run in runs:
        if len(run) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            out.append(f'<polyline class="line" points="{path}" fill="none" stroke="{PALETTE[0]}" '
                       'stroke-width="2"/>')
    out.append("</svg>")
    return Markup("".join(out))
