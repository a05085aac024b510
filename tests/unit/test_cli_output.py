"""The CLI's output layer (``cli.output``, ``cli.watch``) on plain data: layout, -o, --no-headers, --sort-by,
--selector, and the watch loop's changed rows."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml

from llmgw.cli import output, watch
from llmgw.cli.output import Column, Format, Listing, View
from llmgw.core.errors import LlmgwError

LONG = "m" * 120
ITEMS: list[dict[str, Any]] = [
    {"id": "node10", "cpus": 8, "labels": {"pool": "gpu", "rack": "r1"}, "note": "fine"},
    {"id": "node9", "cpus": 16, "labels": {"pool": "cpu"}, "note": LONG},
    {"id": "node2", "cpus": 4, "labels": {}, "note": "two\nlines\there"},
]
NODES = Listing("node", (
    Column("NODE", lambda n: n["id"]),
    Column("CPUS", lambda n: str(n["cpus"])),
    Column("POOL", lambda n: n["labels"].get("pool", "-"), wide=True),
    Column("NOTE", lambda n: n["note"]),
), name=lambda n: n["id"], labels=lambda n: n["labels"])


def starts(line: str, headers: list[str]) -> list[int]:
    return [line.index(h) for h in headers]


def printed(view: View, items: list[dict[str, Any]] = ITEMS) -> str:
    out = io.StringIO()
    output.show(items, NODES, view, out=out)
    return out.getvalue()


def test_columns_are_aligned_full_width_one_line_each_without_boxes_or_colour() -> None:
    """Every value whole (120 characters stay on one line), columns start at one offset on every line, three
    spaces between columns at least, line breaks inside a value made spaces, no box character, no escape."""
    text = printed(View())
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[0].split() == ["NODE", "CPUS", "NOTE"]
    offsets = starts(lines[0], ["NODE", "CPUS", "NOTE"])
    for line, item in zip(lines[1:], ITEMS, strict=True):
        assert line[offsets[0]:].startswith(item["id"])
        assert line[offsets[1]:].startswith(str(item["cpus"]))
        assert line[offsets[0] + len(item["id"]):offsets[1]].isspace() and len(line[:offsets[1]].split()) == 1
        assert line[offsets[1] - 3:offsets[1]] == "   " and line[offsets[2] - 3:offsets[2]] == "   "
    assert lines[2].endswith(LONG) and "two lines here" in lines[3]
    assert not any(c in text for c in "│┃━─…\x1b")
    assert all(line == line.rstrip() for line in lines)


def test_wide_adds_its_columns_and_no_headers_drops_the_header() -> None:
    assert printed(View(output=Format.wide)).splitlines()[0].split() == ["NODE", "CPUS", "POOL", "NOTE"]
    rows = printed(View(headers=False)).splitlines()
    assert [r.split()[0] for r in rows] == ["node10", "node9", "node2"]


def test_sort_by_a_column_is_natural_and_by_a_field_numeric() -> None:
    by_name = printed(View(sort_by="node", headers=False)).splitlines()
    assert [r.split()[0] for r in by_name] == ["node2", "node9", "node10"]
    by_field = printed(View(sort_by="{.cpus}", headers=False)).splitlines()
    assert [r.split()[0] for r in by_field] == ["node2", "node10", "node9"]
    by_label = printed(View(sort_by=".labels.pool", headers=False)).splitlines()
    assert [r.split()[0] for r in by_label] == ["node2", "node9", "node10"]  # missing first, then cpu, gpu
    with pytest.raises(LlmgwError, match="--sort-by: 'nope' is neither a column"):
        printed(View(sort_by="nope"))


def test_selector_equality_inequality_and_existence() -> None:
    def ids(sel: str) -> list[str]:
        return [r.split()[0] for r in printed(View(selector=sel, headers=False)).splitlines()]

    assert ids("pool=gpu") == ["node10"]
    assert ids("pool==cpu") == ["node9"]
    assert ids("pool!=gpu") == ["node9", "node2"]
    assert ids("rack") == ["node10"]
    assert ids("!rack,pool") == ["node9"]
    assert ids("pool=gpu,rack=r2") == []
    with pytest.raises(LlmgwError, match="--selector: 'pool=gpu=x' is not a requirement"):
        ids("pool=gpu=x")
    unlabelled = Listing("replica", NODES.columns, name=lambda n: n["id"])
    with pytest.raises(LlmgwError, match="replica objects have no labels"):
        output.show(ITEMS, unlabelled, View(selector="a=b"), out=io.StringIO())


def test_name_json_and_yaml() -> None:
    assert printed(View(output=Format.name)) == "node/node10\nnode/node9\nnode/node2\n"
    assert json.loads(printed(View(output=Format.json))) == ITEMS
    assert yaml.safe_load(printed(View(output=Format.yaml))) == ITEMS
    assert json.loads(printed(View(output=Format.json, selector="pool=cpu"))) == [ITEMS[1]]


def test_the_header_is_bold_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.delenv("NO_COLOR", raising=False)
    output.show(ITEMS, NODES, View(), out=tty)
    assert tty.getvalue().startswith("\x1b[1mNODE") and tty.getvalue().count("\x1b") == 2
    monkeypatch.setenv("NO_COLOR", "1")
    plain = Tty()
    output.show(ITEMS, NODES, View(), out=plain)
    assert "\x1b" not in plain.getvalue()


def test_watch_prints_the_table_then_only_changed_or_new_rows_under_the_first_columns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three listings: all rows; then node9 changed and node3 new (node2 unchanged, not printed); then the
    reader interrupts. Each later row keeps the first listing's column offsets."""
    first = [dict(i) for i in ITEMS]
    second = [dict(i) for i in ITEMS]
    second[1] = {**second[1], "cpus": 32}
    second.append({"id": "node3", "cpus": 2, "labels": {}, "note": "new"})
    answers = [first, second]

    def fetch() -> list[dict[str, Any]]:
        if not answers:
            raise KeyboardInterrupt
        return answers.pop(0)

    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    out = io.StringIO()
    watch.watch(fetch, NODES, View(), out=out)
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["NODE", "node10", "node9", "node2", "node9", "node3"]
    assert lines[4].split()[1] == "32"
    offsets = starts(lines[0], ["NODE", "CPUS", "NOTE"])
    assert lines[5][offsets[1]:].startswith("2 ") and lines[5][offsets[2]:] == "new"


def test_an_empty_list_prints_nothing_and_says_so_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """As kubectl's "No resources found": no header for a script to read, a sentence for a person."""
    out = io.StringIO()
    output.show(ITEMS, NODES, View(selector="pool=tpu"), out=out)
    assert out.getvalue() == "" and capsys.readouterr().err == "no node found matching --selector pool=tpu\n"
    output.show([], NODES, View(output=Format.json), out=out)
    assert out.getvalue() == "[]\n"


def test_watch_documents_leave_out_what_a_listing_added(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [[{"id": "n1", "_engines": {"pool": "p"}, "labels": {}}]]

    def fetch() -> list[dict[str, Any]]:
        if not answers:
            raise KeyboardInterrupt
        return answers.pop(0)

    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    out = io.StringIO()
    watch.watch(fetch, NODES, View(output=Format.json), out=out)
    assert json.loads(out.getvalue()) == {"id": "n1", "labels": {}}


def test_watch_ends_quietly_when_the_reader_goes() -> None:
    class Gone(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError

    watch.watch(lambda: ITEMS, NODES, View(), out=Gone())  # returns, no exception
