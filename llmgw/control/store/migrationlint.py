"""The migrations' floors checked from their source (issue 29), without importing them: ``problems(versions)``.

What ``tests/unit/test_migration_floors.py`` holds every migration to (see ``schemafloor`` for what a floor is):

- each declares ``floor = "NNNN"``, a revision of the chain;
- floors never decrease along the chain and never pass their own revision;
- a migration whose floor is below its own revision claims to be expand-only, so nothing outside its
  ``downgrade()`` drops or renames a table or column, makes a column NOT NULL, changes a type (``op.…`` or
  a ``batch_alter_table``'s ``batch.…``), adds a NOT NULL column without a server default, or runs raw SQL
  that drops, renames or alters a column's type or nullability.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

#: Calls that take away what an older release's code reads or writes, whatever their arguments.
_CONTRACTING = {"drop_table", "drop_column", "rename_table"}
#: ``alter_column`` keywords that do (a rename, a new type, NOT NULL).
_ALTERING = {"new_column_name", "type_"}
_RAW = re.compile(r"\b(DROP|RENAME)\b|\bSET\s+NOT\s+NULL\b|\bALTER\s+COLUMN\b.*\bTYPE\b", re.IGNORECASE | re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """One migration file as read: its name, revision, down revision, floor (None: none declared), tree."""

    file: str
    revision: str
    down_revision: str | None
    floor: str | None
    tree: ast.Module


def read(path: pathlib.Path) -> Source:
    tree = ast.parse(path.read_text(), filename=str(path))
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant):
                values[node.targets[0].id] = node.value.value
    floor = values.get("floor")
    down = values.get("down_revision")
    return Source(path.name, str(values.get("revision", "")), down if isinstance(down, str) else None,
                  floor if isinstance(floor, str) else None, tree)


def chain(versions: pathlib.Path) -> list[Source]:
    """The migrations in ``versions``, oldest first, following ``down_revision`` from the first."""
    sources = [read(p) for p in sorted(versions.glob("*.py")) if not p.name.startswith("_")]
    by_down = {s.down_revision: s for s in sources}
    out: list[Source] = []
    nxt = by_down.get(None)
    while nxt is not None and nxt not in out:
        out.append(nxt)
        nxt = by_down.get(nxt.revision)
    return out + [s for s in sources if s not in out]  # any off the line: reported by problems()


def contracting_calls(tree: ast.Module) -> list[str]:
    """Each contracting operation in the module outside ``downgrade()``: "line N: what"."""
    found: list[str] = []
    body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "downgrade")]
    for top in body:
        for node in ast.walk(top):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                why = _contracting(node, node.func.attr)
                if why:
                    found.append(f"line {node.lineno}: {why}")
    return found


def _contracting(call: ast.Call, name: str) -> str:
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    if name in _CONTRACTING:
        return f"{name}()"
    if name == "alter_column":
        given = sorted(_ALTERING & set(keywords))
        if given:
            return f"alter_column({given[0]}=…)"
        if _is_false(keywords.get("nullable")):
            return "alter_column(nullable=False)"
    if name == "add_column":
        column = next((a for a in call.args if isinstance(a, ast.Call)), None)
        if column is not None and _not_null_without_default(column):
            return "add_column() of a NOT NULL column without a server_default"
    if name == "execute":
        for node in ast.walk(call):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _RAW.search(node.value):
                return f"execute({node.value.strip()[:60]!r})"
    return ""


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _not_null_without_default(column: ast.Call) -> bool:
    keywords = {k.arg: k.value for k in column.keywords if k.arg}
    pk = keywords.get("primary_key")
    not_null = _is_false(keywords.get("nullable")) or (isinstance(pk, ast.Constant) and pk.value is True)
    return not_null and "server_default" not in keywords


def problems(versions: pathlib.Path) -> list[str]:
    """Every way the migrations in ``versions`` break the floor rules, one sentence each; [] when none."""
    line = chain(versions)
    place = {s.revision: i for i, s in enumerate(line)}
    out: list[str] = []
    last_floor = -1
    for i, s in enumerate(line):
        if place.get(s.down_revision, -1) != i - 1:
            out.append(f"{s.file}: down_revision {s.down_revision!r} does not follow the chain's line")
            continue
        if s.floor is None:
            out.append(f'{s.file}: declares no floor: add floor = "NNNN", the oldest migration head a release '
                       "may have and still run on this schema (schemafloor)")
            continue
        at = place.get(s.floor)
        if at is None:
            out.append(f"{s.file}: floor {s.floor!r} is not a revision of the chain")
            continue
        if at > i:
            out.append(f"{s.file}: floor {s.floor} is above its own revision {s.revision}")
        if at < last_floor:
            out.append(f"{s.file}: floor {s.floor} is below the floor of the migration before it "
                       f"({line[last_floor].revision}): floors never go down")
        last_floor = max(last_floor, at)
        if at < i:
            for call in contracting_calls(s.tree):
                out.append(f"{s.file}: {call} contracts the schema, yet floor {s.floor} (below {s.revision}) "
                           "says the release before still runs on it: raise the floor to "
                           f"{s.revision}, or drop it in the next release (expand, then contract)")
    return out
