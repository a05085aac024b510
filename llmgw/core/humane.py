"""Values as people read them, shared by the UI and the CLI (issue 30): sizes, durations, times, numbers.

``size(536870912)`` → ``512 MiB``, ``duration(300.0)`` → ``5m``, ``ago(t, now)`` → ``3m ago`` (with
``utc(t)`` → ``2026-12-05 07:12:51 UTC`` for the exact time on hover), ``number(1234567)`` → ``1.2M``.
Pure: standard library only, the clock passed in; every function takes what the API sends (a number, or
None and other junk read as "nothing": ``-``) and never raises.
"""

from __future__ import annotations

import datetime
import math

__all__ = ["SIZE_UNITS", "ago", "duration", "exact_duration", "exact_size", "number", "size", "utc", "value"]

SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
NOTHING = "-"


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _trim(x: float, digits: int) -> str:
    """``x`` with at most ``digits`` decimals, trailing zeros cut: 512.0 → ``512``, 1.50 → ``1.5``."""
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def size_unit(n: float) -> tuple[float, str]:
    """The binary unit ``n`` bytes reads best in: (its divisor, its name)."""
    n = abs(n)
    for i, unit in enumerate(SIZE_UNITS):
        if n < 1024 ** (i + 1) or i == len(SIZE_UNITS) - 1:
            return float(1024 ** i), unit
    return 1.0, "B"  # unreachable


def size(n: object, *, digits: int = 1) -> str:
    """Bytes in binary units: 536870912 → ``512 MiB``, 1610612736 → ``1.5 GiB``, 900 → ``900 B``."""
    x = _num(n)
    if x is None:
        return NOTHING
    div, unit = size_unit(x)
    return f"{_trim(x / div, 0 if unit == 'B' else digits)} {unit}"


def duration(seconds: object) -> str:
    """Seconds in the largest units that say them, at most two: 300 → ``5m``, 90 → ``1m30s``, 0.25 →
    ``250ms``, 3600 → ``1h``, 93784 → ``1d2h``, 2.5 → ``2.5s``."""
    x = _num(seconds)
    if x is None:
        return NOTHING
    sign, x = ("-" if x < 0 else ""), abs(x)
    if x == 0:
        return "0s"
    if x < 1:
        return f"{sign}{_trim(x * 1000, 0 if x >= 0.01 else 1)}ms"
    if x < 60:
        return f"{sign}{_trim(x, 1)}s"
    whole = round(x)
    parts = []
    for unit, size_s in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size_s:
            parts.append(f"{whole // size_s}{unit}")
            whole %= size_s
        if len(parts) == 2:
            break
        if parts and whole == 0:
            break
    return sign + "".join(parts)


def ago(at: object, now: float) -> str:
    """How long before ``now`` ``at`` was: ``just now``, ``42s ago``, ``3m ago``, ``2h ago``, ``5d ago``; a
    time ahead of ``now`` reads ``in 3m``; 0 or nothing: ``-`` (the API's "never")."""
    x = _num(at)
    if x is None or x <= 0:
        return NOTHING
    delta = now - x
    if abs(delta) < 1:
        return "just now"
    amount = _coarse(abs(delta))
    return f"{amount} ago" if delta > 0 else f"in {amount}"


def _coarse(seconds: float) -> str:
    for unit, size_s in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size_s:
            return f"{int(seconds // size_s)}{unit}"
    return f"{int(seconds)}s"


def utc(at: object, *, seconds: bool = True) -> str:
    """A Unix time as ``2026-12-05 07:12:51 UTC`` (``-`` for nothing)."""
    x = _num(at)
    if x is None or x <= 0:
        return NOTHING
    t = datetime.datetime.fromtimestamp(x, tz=datetime.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC")


def iso(at: object) -> str:
    """A Unix time as ISO 8601 in UTC, for ``<time datetime=…>`` ("" for nothing)."""
    x = _num(at)
    if x is None or x <= 0:
        return ""
    return datetime.datetime.fromtimestamp(x, tz=datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def number(x: object) -> str:
    """A count or rate, short: 1234 → ``1.2k``, 3_400_000 → ``3.4M``, 0.25 → ``0.25``, 12 → ``12``."""
    v = _num(x)
    if v is None:
        return NOTHING
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return _trim(v / div, 1) + suffix
    return _trim(v, 2)


def value(x: object, unit: str) -> str:
    """``x`` in ``unit``'s words: ``B`` a size, ``s`` a duration, ``%`` a percentage, else a number and the
    unit as it is (``/s``, `` ms``)."""
    if unit == "B":
        return size(x)
    if unit == "s":
        return duration(x)
    text = number(x)
    return text if text == NOTHING else text + unit


def exact_size(n: object) -> object:
    """A byte count in the largest binary unit that says it exactly, as a model file writes it (``512MiB``,
    ``8GiB``), so that it reads back to the same number (``core.units.parse_bytes``); else ``n`` unchanged."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return n
    for i in range(len(SIZE_UNITS) - 1, 0, -1):
        if n % 1024 ** i == 0:
            return f"{n // 1024 ** i}{SIZE_UNITS[i]}"
    return n


def exact_duration(seconds: object) -> object:
    """Seconds as a model file writes them (``5m``, ``1h30m``, ``90s``, ``250ms``) when that reads back to the
    same number (``core.units.parse_duration``); else ``seconds`` unchanged."""
    x = _num(seconds)
    if x is None or x <= 0:
        return seconds
    if x < 1:
        ms = x * 1000
        return f"{round(ms)}ms" if abs(ms - round(ms)) < 1e-9 else seconds
    if x != int(x):
        return seconds
    whole, parts = int(x), []
    for unit, size_s in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size_s:
            parts.append(f"{whole // size_s}{unit}")
            whole %= size_s
    return "".join(parts)
