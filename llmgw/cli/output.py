"""One output layer for the CLI's listings: plain aligned columns, ``-o wide|json|yaml|name``, ``--no-headers``,
``--sort-by``, ``--selector`` (the watch loop is ``cli.watch``).

A listing is its columns (a header and a function from an item, the API's document, to the cell's text) and
the items themselves. Printed, every cell is its whole value on one line: columns are padded to the widest cell
and separated by three spaces (as kubectl's tabwriter), never wrapped, cut or boxed, whatever the width, so
``llmgw get replicas | grep … | awk '{print $1}'`` reads whole ids. On a terminal the header is bold, and that is
the only difference (no colour at all with ``NO_COLOR`` set or off a terminal).

Cells are the items' values as the commands make them; this module formats nothing itself (a value's humane
form is its listing's business), it only lays them out.
"""

from __future__ import annotations

import enum
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from llmgw.core.errors import LlmgwError

GAP = "   "
_BOLD, _RESET = "\x1b[1m", "\x1b[0m"


class Format(enum.StrEnum):
    table = "table"
    wide = "wide"  # the table with more columns
    json = "json"  # the API's items, as they came
    yaml = "yaml"
    name = "name"  # KIND/NAME, one a line


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    cell: Callable[[Any], str]
    #: Shown only with ``-o wide``.
    wide: bool = False


@dataclass(frozen=True, slots=True)
class Listing:
    """What a ``get`` lists: the kind (``-o name`` prints ``kind/name``), columns, a name and labels per item."""

    kind: str
    columns: tuple[Column, ...]
    name: Callable[[Any], str]
    #: The item's labels for ``--selector``; None: this kind has none (the flag is refused for it).
    labels: Callable[[Any], Mapping[str, str]] | None = None

    def shown(self, wide: bool) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if wide or not c.wide)


@dataclass(frozen=True, slots=True)
class View:
    """The output flags a ``get`` was given."""

    output: Format = Format.table
    headers: bool = True
    sort_by: str = ""
    selector: str = ""


def one_line(value: object) -> str:
    """A cell's text on one line: line breaks and tabs become spaces (a message can hold an engine's output)."""
    return re.sub(r"[\r\n\t]+", " ", str(value))


def widths_of(lines: Iterable[Sequence[str]], start: Sequence[int] = ()) -> list[int]:
    out = list(start)
    for line in lines:
        for i, cell in enumerate(line):
            if i < len(out):
                out[i] = max(out[i], len(cell))
            else:
                out.append(len(cell))
    return out


def line_of(cells: Sequence[str], widths: Sequence[int]) -> str:
    """One line: each cell padded to its column's width, three spaces between; no trailing blanks."""
    return GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()


def render(headers: Sequence[str] | None, rows: Sequence[Sequence[str]], *, bold: bool = False) -> list[str]:
    """The lines of a table: the header (unless None) and the rows, aligned, full values."""
    rows = [[one_line(c) for c in r] for r in rows]
    widths = widths_of(rows, [len(h) for h in headers] if headers is not None else ())
    lines = [line_of(r, widths) for r in rows]
    if headers is not None:
        lines.insert(0, header_line(headers, widths, bold=bold))
    return lines


def header_line(headers: Sequence[str], widths: Sequence[int], *, bold: bool = False) -> str:
    head = line_of(headers, widths)
    return f"{_BOLD}{head}{_RESET}" if bold else head


def styled(out: TextIO) -> bool:
    """Whether to embolden the header: a terminal, and NO_COLOR not set (https://no-color.org)."""
    try:
        return out.isatty() and not os.environ.get("NO_COLOR")
    except (AttributeError, ValueError):
        return False


# -- --selector ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!exists"
    value: str = ""

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value


_REQ_RE = re.compile(r"^\s*(!?)([A-Za-z0-9_.\-/]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.\-]*))?\s*$")


def parse_selector(text: str) -> list[Requirement]:
    """``key=value,key!=value,key,!key`` (kubectl's equality selectors); LlmgwError naming the bad term."""
    out = []
    for term in text.split(","):
        if not term.strip():
            continue
        m = _REQ_RE.match(term)
        if not m or (m.group(1) and m.group(3)):
            raise LlmgwError(f"--selector: {term.strip()!r} is not a requirement; write key=value, key!=value, key "
                             "or !key, comma-separated (e.g. -l pool=gpu,rack!=r12)")
        neg, key, op, value = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if op is None:
            out.append(Requirement(key, "!exists" if neg else "exists"))
        else:
            out.append(Requirement(key, "!=" if op == "!=" else "=", value))
    return out


def select(items: list[Any], listing: Listing, selector: str) -> list[Any]:
    """The items whose labels satisfy every requirement (done here: the API has no label query)."""
    if not selector.strip():
        return items
    if listing.labels is None:
        raise LlmgwError(f"--selector: {listing.kind} objects have no labels (nodes and models do); filter this "
                         "list with the command's own flags (--help) or grep")
    reqs = parse_selector(selector)
    labels = listing.labels
    return [i for i in items if all(r.holds(labels(i) or {}) for r in reqs)]


# -- --sort-by ---------------------------------------------------------------------------------------------------
def _natural(text: str) -> tuple[tuple[int, Any], ...]:
    """``node10`` after ``node9``: digit runs compared as numbers."""
    return tuple((0, int(p)) if p.isdigit() else (1, p.lower()) for p in re.split(r"(\d+)", text) if p)


def _field(item: Any, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        item = item.get(part) if isinstance(item, Mapping) else None
    return item


def _value_key(v: Any) -> tuple[int, Any]:
    """Missing values first, then numbers by value, then text naturally."""
    if v is None:
        return (0, 0)
    if isinstance(v, bool | int | float):
        return (1, float(v))
    return (2, _natural(v if isinstance(v, str) else json.dumps(v, sort_keys=True)))


def _norm(header: str) -> str:
    return re.sub(r"[\s_\-]+", "-", header.strip().upper())


def sort_key(listing: Listing, spec: str, wide: bool) -> Callable[[Any], Any]:
    """A column's header (``--sort-by NODE``, ``--sort-by last-used``) or a field of the item, JSONPath-lite
    (``--sort-by .status.ready_replicas``, ``'{.metadata.name}'``)."""
    s = spec.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if s.startswith("."):
        return lambda item: _value_key(_field(item, s))
    for c in listing.columns:
        if _norm(c.header) == _norm(s):
            cell = c.cell
            return lambda item: _natural(one_line(cell(item)))
    headers = ", ".join(c.header for c in listing.shown(wide))
    raise LlmgwError(f"--sort-by: {spec!r} is neither a column ({headers}) nor a field such as .metadata.name")


# -- printing ---------------------------------------------------------------------------------------------------
def prepare(items: list[Any], listing: Listing, view: View) -> list[Any]:
    """Filtered by the selector, then sorted (stable: the API's order breaks ties)."""
    items = select(items, listing, view.selector)
    if view.sort_by:
        items = sorted(items, key=sort_key(listing, view.sort_by, view.output is Format.wide))
    return items


def rows_of(items: Iterable[Any], columns: Sequence[Column]) -> list[list[str]]:
    return [[one_line(c.cell(i)) for c in columns] for i in items]


def documents(items: list[Any], fmt: Format) -> str:
    """``-o json`` (the items as the API gave them, indented) or ``-o yaml``."""
    if fmt is Format.json:
        return json.dumps(items, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(items, sort_keys=False, allow_unicode=True, default_flow_style=False)


def text(items: list[Any], listing: Listing, view: View, *, bold: bool = False) -> str:
    """The whole output of a listing for ``view``, items already prepared."""
    if view.output in (Format.json, Format.yaml):
        return documents(items, view.output)
    if view.output is Format.name:
        return "".join(f"{listing.kind}/{listing.name(i)}\n" for i in items)
    columns = listing.shown(view.output is Format.wide)
    lines = render([c.header for c in columns] if view.headers else None, rows_of(items, columns), bold=bold)
    return "".join(f"{line}\n" for line in lines)


def emit(s: str, out: TextIO | None = None) -> None:
    """Write and flush; a reader that went away (``| head -1``) ends the command quietly: see ``quiet_pipe``."""
    out = out or sys.stdout
    out.write(s)
    out.flush()


def quiet_pipe() -> None:
    """After a BrokenPipeError on stdout: point it at /dev/null, so the interpreter's last flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def show(items: list[Any], listing: Listing, view: View, *, out: TextIO | None = None,
         empty: str = "") -> None:
    """Print a listing. No item left: nothing on stdout (a script reads no row, not even a header) and ``empty``,
    or a sentence saying none was found, on stderr, as kubectl's "No resources found"."""
    out = out or sys.stdout
    items = prepare(items, listing, view)
    if not items and view.output in (Format.table, Format.wide):
        which = f" matching --selector {view.selector}" if view.selector.strip() else ""
        print(empty or f"no {listing.kind} found{which}", file=sys.stderr)
        return
    emit(text(items, listing, view, bold=styled(out)), out)


@dataclass(slots=True)
class Table:
    """A free-standing table (describe's sections, ``context list``): headers and rows of text, laid out as a
    listing's are."""

    headers: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)

    def text(self, *, indent: str = "", headers: bool = True) -> str:
        lines = render(self.headers if headers else None, self.rows)
        return "".join(f"{indent}{line}\n" for line in lines)
