"""Keys' and projects' priority classes and weights (issue 32), kept in the store without a migration.

One row of ``cluster_settings``, key ``queueing``, its JSON value
``{"keys": {ID: {"priority_class": C, "weight": W}}, "projects": {NAME: {...}}}``: not in the keys' and
projects' ``limits`` JSON, because 0.2.0 reads those strictly (``Limits.from_doc`` refuses an unknown field, and
a 0.2.0 control plane beside this one would then fail to list every key), while it reads ``cluster_settings`` by
the keys it knows and ignores the rest (``git show v0.2.0:llmgw/control/store/settings.py``; tested in
``tests/integration/test_priorities_api.py``). A 0.2.0 control plane leading publishes tables without classes:
requests queue by the key's integer ``priority`` then, as they did.

Written under ``SELECT ... FOR UPDATE`` of the row, so two control planes changing two keys at once lose neither.
Deleting a key or a project forgets its entry (``forget``, in the deletion's transaction), so a project made
again under the name starts without the old one's class.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from llmgw.control.store.tables import ClusterSettingRow
from llmgw.core import queueclasses

if TYPE_CHECKING:  # the store's deletions call ``forget``: the Store itself is assembled after them
    from llmgw.control.store.store import Store

ROW = "queueing"
KINDS = ("keys", "projects")


@dataclasses.dataclass(frozen=True, slots=True)
class Assigned:
    """A key's or project's class ("": not set) and weight (0: not set)."""

    priority_class: str = ""
    weight: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return {"priority_class": self.priority_class, "weight": self.weight}


@dataclasses.dataclass(frozen=True, slots=True)
class Queueing:
    keys: dict[str, Assigned] = dataclasses.field(default_factory=dict)
    projects: dict[str, Assigned] = dataclasses.field(default_factory=dict)


def _assigned(doc: Any) -> Assigned | None:
    if not isinstance(doc, dict):
        return None
    klass, weight = doc.get("priority_class", ""), doc.get("weight", 0.0)
    if not isinstance(klass, str) or (klass and not queueclasses.NAME.match(klass)):
        klass = ""
    if queueclasses.weight_refusal(weight) is not None:
        weight = 0.0
    found = Assigned(klass, float(weight))
    return found if found != Assigned() else None


def _parse(value: Any) -> Queueing:
    """Tolerant: what a later version wrote and this one cannot read is left out, not a failure."""
    out = Queueing()
    for kind in KINDS:
        entries = value.get(kind) if isinstance(value, dict) else None
        for name, doc in (entries.items() if isinstance(entries, dict) else ()):
            if (found := _assigned(doc)) is not None:
                getattr(out, kind)[str(name)] = found
    return out


def read(store: Store) -> Queueing:
    with store._session() as s:
        row = s.get(ClusterSettingRow, ROW)
        return _parse(row.value if row is not None else None)


def assign(store: Store, kind: str, name: str, assigned: Assigned, *, by: str, now: float | None = None) -> None:
    """Sets ``kind`` (keys or projects) ``name``'s class and weight; ``Assigned()`` removes its entry."""
    change(store, kind, name, assigned.priority_class, assigned.weight, by=by, now=now)


def change(store: Store, kind: str, name: str, priority_class: str | None, weight: float | None, *, by: str,
           now: float | None = None) -> Assigned:
    """Changes what is given (None: as it is) of ``name``'s entry, under the row's lock; the entry as it is now.
    Both unset removes it."""
    with store._tx() as s:
        row = s.scalars(sa.select(ClusterSettingRow).where(ClusterSettingRow.key == ROW).with_for_update()).first()
        value: dict[str, Any] = dict(row.value) if row is not None and isinstance(row.value, dict) else {}
        entries = {**(value.get(kind) if isinstance(value.get(kind), dict) else {})}
        before = _assigned(entries.get(name)) or Assigned()
        after = Assigned(before.priority_class if priority_class is None else priority_class,
                         before.weight if weight is None else float(weight))
        if after == Assigned():
            entries.pop(name, None)
        else:
            entries[name] = after.to_doc()
        value[kind] = entries
        stamp = time.time() if now is None else now
        if row is None:
            s.add(ClusterSettingRow(key=ROW, value=value, updated_at=stamp, updated_by=by))
        else:
            row.value, row.updated_at, row.updated_by = value, stamp, by
        return after


def forget(s: Session, kind: str, name: str) -> None:
    """Drops ``name``'s entry, inside the transaction ``s`` that deletes the key or project."""
    row = s.scalars(sa.select(ClusterSettingRow).where(ClusterSettingRow.key == ROW).with_for_update()).first()
    if row is None or not isinstance(row.value, dict) or name not in (row.value.get(kind) or {}):
        return
    row.value = {**row.value, kind: {k: v for k, v in row.value[kind].items() if k != name}}
