"""Parsing of the human-written quantities in model files: sizes and durations."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_bytes(value: object) -> int:
    """``"1.5GiB"`` -> 1610612736. Plain integers are bytes. Raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 512MiB or 4GiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative; give one such as 512MiB, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            size = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
            # 400 nines read as float are inf, and int(inf) raised OverflowError: a 500 where a 400 belongs.
            if not math.isfinite(size):
                raise ValueError(f"a size past any disk: {value[:40]!r}…; give one such as 512MiB")
            return int(size)
    raise ValueError(f"expected a size such as 512MiB or 4GiB, got {value!r}")


def parse_duration(value: object) -> float:
    """``"5m"``, ``"90s"``, ``"1h30m"`` or a number of seconds -> seconds as float."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s or 5m, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
            if not math.isfinite(seconds):
                raise ValueError(f"a duration past any clock: {value[:40]!r}…; give one such as 90s or 5m")
            return seconds
    raise ValueError(f"expected a duration such as 90s or 5m, got {value!r}")


def format_bytes(n: int) -> str:
    """1610612736 -> ``"1.5 GiB"``, for messages and tables."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_ago(at: float, *, now: float) -> str:
    """How long before ``now`` ``at`` was, for "last used": ``never`` (0), ``12s ago``, ``2m ago``, ``3h ago``."""
    if not at:
        return "never"
    s = max(0, int(now - at))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"
