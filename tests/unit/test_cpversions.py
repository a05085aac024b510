"""The control planes' versions told as events (``control.cpversions``), over a real SQLite store: a leader taking
the lease at another version than the last leader's (kept in the ``settings`` table, or read from the control
planes' rows where a release before 0.2.0 led) tells ``ControlPlaneVersionChanged`` once; a live standby at another
version is told once as ``ControlPlaneVersionSkew``; nothing is told when the versions agree."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.control import cpversions
from llmgw.control.events import Event
from llmgw.control.leader import Instance
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredControlPlane


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StoreThread]:
    store = Store.open(tmp_path)
    db = StoreThread(store)
    yield db
    db.close()
    store.close()


def _told(version: str, db: StoreThread) -> list[Event]:
    said: list[Event] = []
    asyncio.run(cpversions.Versions("cp1", version, said.append, lambda: 1.0).elected(db))
    return said


def test_a_leader_at_another_version_than_the_last_tells_the_change_once(db: StoreThread) -> None:
    assert _told("0.1.0", db) == []  # the first leader ever: nothing to compare with; its version is kept
    assert db.store.settings()[cpversions.KEY] == "0.1.0"
    said = _told("0.2.0", db)
    assert [(e.reason, e.object, e.message) for e in said] == [
        ("ControlPlaneVersionChanged", "controlplane/cp1", "control plane 0.1.0 → 0.2.0 (cp1 leads now)")]
    assert db.store.settings()[cpversions.KEY] == "0.2.0"
    assert _told("0.2.0", db) == []  # the same version leading again (a restart, a failover): no change


def test_a_database_a_release_before_0_2_0_led_is_read_from_the_control_planes_rows(db: StoreThread) -> None:
    """No settings row (0.1.0 wrote none): the control plane row seen last says the version that led."""
    db.store.beat_controlplane(StoredControlPlane("cp0", "http://a", "a:1", "0.0.9", 1.0, 5.0))
    db.store.beat_controlplane(StoredControlPlane("cp1", "http://b", "b:1", "0.1.0", 1.0, 9.0))
    said = _told("0.2.0", db)
    assert [e.message for e in said] == ["control plane 0.1.0 → 0.2.0 (cp1 leads now)"]


def test_a_standby_upgraded_first_tells_the_change_when_it_takes_over_from_a_release_before_0_2_0(
        db: StoreThread) -> None:
    """The rolling upgrade's order: cp1 stood by at 0.2.0 (its row beaten last) while cp0 led at 0.1.0 (no settings
    row); cp0 stops and cp1 takes the lease: the change is told, from the 0.1.0 that led."""
    db.store.beat_controlplane(StoredControlPlane("cp0", "http://a", "a:1", "0.1.0", 1.0, 5.0))
    db.store.beat_controlplane(StoredControlPlane("cp1", "http://b", "b:1", "0.2.0", 2.0, 9.0))
    said = _told("0.2.0", db)
    assert [e.message for e in said] == ["control plane 0.1.0 → 0.2.0 (cp1 leads now)"]


def test_a_live_control_plane_at_another_version_is_told_once() -> None:
    said: list[Event] = []
    versions = cpversions.Versions("cp1", "0.2.0", said.append, lambda: 1.0)

    def inst(cp_id: str, role: str, version: str) -> Instance:
        return Instance(cp_id, role, 0, -1.0, "http://x", "x:1", version, 0.0)

    seen = [inst("cp1", "leader", "0.2.0"), inst("cp2", "standby", "0.1.0"), inst("cp3", "gone", "0.0.1"),
            inst("cp4", "standby", "0.2.0")]
    versions.check(seen)
    versions.check(seen)
    assert [(e.reason, e.object, e.message) for e in said] == [
        ("ControlPlaneVersionSkew", "controlplane/cp2", "control plane cp2 runs 0.1.0, the leader 0.2.0")]
    versions.check([inst("cp2", "standby", "0.1.1")])  # it moved on to yet another version: told again
    assert said[-1].message == "control plane cp2 runs 0.1.1, the leader 0.2.0"
