"""``llmgw get … --watch``: the listing, then each row again when it changes, until Ctrl-C (kubectl's ``-w``).

It polls: the lists it watches (models, replicas, nodes, …) have no long poll. The one long poll the API
has, ``GET /api/v1/endpoints?after=V&timeout=T``, answers when the routers' table changes, which an apply,
a phase other than Ready, a node's heartbeat or a key never does, so it cannot stand in for them.
Every ``WATCH_INTERVAL_S`` it lists again and prints the rows that differ from what it printed last, under the
columns it printed first (a wider cell pushes its line's later cells right, never wraps). An item that went
away is forgotten (printed again if it comes back).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import yaml

from llmgw.cli import output
from llmgw.cli.output import Format, Listing, View

#: Seconds between two listings: often enough to see a phase change, rare enough that a watch on a cluster of
#: thousands of replicas costs the control plane little (one list every two seconds).
WATCH_INTERVAL_S = 2.0


def _document(item: Any, listing: Listing, fmt: Format) -> str:
    if isinstance(item, dict):  # what a listing added for its cells (``_engines``, ``_self``) is not the API's
        item = {k: v for k, v in item.items() if not k.startswith("_")}
    if fmt is Format.json:
        return json.dumps(item, indent=2, ensure_ascii=False) + "\n"
    if fmt is Format.yaml:
        return "---\n" + yaml.safe_dump(item, sort_keys=False, allow_unicode=True)
    return f"{listing.kind}/{listing.name(item)}\n"


def watch(fetch: Callable[[], list[Any]], listing: Listing, view: View, *, interval: float = WATCH_INTERVAL_S,
          out: TextIO | None = None) -> None:
    """Print the listing, then its changed rows, until interrupted or the reader goes; LlmgwError from ``fetch``
    ends it (the caller says why)."""
    out = out or sys.stdout
    try:
        _loop(fetch, listing, view, interval, out)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        if out is sys.stdout:
            output.quiet_pipe()


def _loop(fetch: Callable[[], list[Any]], listing: Listing, view: View, interval: float, out: TextIO) -> None:
    columns = listing.shown(view.output is Format.wide)
    tabular = view.output in (Format.table, Format.wide)
    seen: dict[str, Any] = {}
    widths: list[int] = []
    first = True
    while True:
        items = output.prepare(fetch(), listing, view)
        now: dict[str, Any] = {}
        changed = []
        for item in items:
            key = listing.name(item)
            mark = output.rows_of([item], columns)[0] if tabular else item
            now[key] = mark
            if seen.get(key) != mark:
                changed.append((item, mark))
        if tabular:
            rows = [mark for _, mark in changed]
            lines: list[str] = []
            if first:
                heads = [c.header for c in columns]
                widths = output.widths_of(rows, [len(h) for h in heads] if view.headers else ())
                if view.headers:
                    lines.append(output.header_line(heads, widths, bold=output.styled(out)))
            lines += [output.line_of(r, widths) for r in rows]
            text = "".join(f"{line}\n" for line in lines)
        else:
            text = "".join(_document(item, listing, view.output) for item, _ in changed)
        if text:
            output.emit(text, out)
        seen, first = now, False
        time.sleep(interval)
