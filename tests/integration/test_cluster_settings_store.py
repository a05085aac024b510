"""The cluster settings (issue 24) in the store, on SQLite and on a real PostgreSQL: the same answers on both.

Migration 0013 makes ``cluster_settings``; a key never set reads as its default, a write returns the keys
whose value changed, a value read back is the one written (JSON lists and booleans alike), and a value
stored by an older version that the rule now refuses is left out rather than failing every apply.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmgw.control.store import settings as settings_store
from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Store
from llmgw.control.store.tables import ClusterSettingRow

_names = itertools.count(1)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh database of each kind, migrated to the head."""
    if request.param == "sqlite":
        url = store_mod.sqlite_url(tmp_path)
    else:
        url = request.getfixturevalue("pg").create_database(f"cs{next(_names)}")
    s = Store.open_url(url)
    try:
        yield s
    finally:
        s.close()


def test_settings_default_change_and_read_back(store: Store) -> None:
    """Defaults first; a write returns what changed; the same write again changes nothing."""
    assert settings_store.read(store) == settings_store.ClusterSettings()
    with store.engine.connect() as c:
        assert "cluster_settings" in sa.inspect(c).get_table_names()
    values = settings_store.SettingsChange(allowed_env=["FOO_BAR", "A_B"], allow_remote_code=True).values()
    assert settings_store.write(store, values, by="admin") == ["allow_remote_code", "allowed_env"]
    assert settings_store.read(store) == settings_store.ClusterSettings(allowed_env=["A_B", "FOO_BAR"],
                                                                         allow_remote_code=True)
    assert settings_store.write(store, values, by="admin") == []
    assert settings_store.write(store, {"allow_remote_code": False}, by="root") == ["allow_remote_code"]
    assert settings_store.read(store).allow_remote_code is False
    with store._session() as s:
        row = s.get(ClusterSettingRow, "allow_remote_code")
        assert row is not None and row.updated_by == "root" and row.updated_at > 0


def test_a_stored_name_the_rule_now_refuses_is_left_out(store: Store) -> None:
    """A list written before a name was ruled out reads back without it, not as an error."""
    with store._tx() as s:
        s.add(ClusterSettingRow(key="allowed_env", value=["FOO_BAR", "LD_PRELOAD"], updated_at=1.0, updated_by="x"))
    assert settings_store.read(store).allowed_env == ["FOO_BAR"]


def test_priority_classes_and_assignments_and_their_deletion(store: Store) -> None:
    """Issue 32: the classes are a setting; a key's and a project's class and weight live in the ``queueing`` row,
    unread by the settings document, changed one entry at a time, and forgotten with the key or project."""
    from llmgw.control.store import queueing
    from llmgw.control.store.store import StoredKey

    assert settings_store.read(store).priority_classes == ["interactive", "batch"]
    assert settings_store.write(store, {"priority_classes": ["premium", "interactive", "batch"]}, by="t") == [
        "priority_classes"]
    store.create_project("team", description="", created_by="t", now=1.0)
    store.add_key(StoredKey(id="key-q", name="k", sha256="a" * 64, project="team", created_at=1.0))
    queueing.assign(store, "projects", "team", queueing.Assigned("premium", 3.0), by="t")
    queueing.assign(store, "keys", "key-q", queueing.Assigned("batch", 0.0), by="t")
    queueing.assign(store, "keys", "key-gone", queueing.Assigned("", 2.0), by="t")
    queueing.assign(store, "keys", "key-gone", queueing.Assigned(), by="t")  # unset: the entry goes
    found = queueing.read(store)
    assert found.keys == {"key-q": queueing.Assigned("batch", 0.0)}
    assert found.projects == {"team": queueing.Assigned("premium", 3.0)}
    assert settings_store.read(store).priority_classes == ["premium", "interactive", "batch"]
    assert store.delete_key("key-q") and store.delete_project("team")
    assert queueing.read(store) == queueing.Queueing()
    with store._tx() as s:  # a value a later version wrote that this one cannot read is left out, not a failure
        s.get(ClusterSettingRow, queueing.ROW).value = {"keys": {"k": {"priority_class": 7, "weight": "x"},
                                                                 "k2": {"weight": 2}}, "projects": []}
    assert queueing.read(store).keys == {"k2": queueing.Assigned("", 2.0)}
