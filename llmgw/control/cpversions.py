"""The llmgw versions the cluster's control planes run, told as events (issue 29's skew policy).

A rolling upgrade runs control planes of two releases on one database for a while (``core.skew``): the
standbys first, then the leader by a failover. Each step is told in ``llmgw events`` (and the UI's):

- ``ControlPlaneVersionChanged`` (``control plane 0.1.0 → 0.2.0``): a control plane takes the lease at another
  version than the one that led before it. Where the last leader's version is kept: the ``controlplane_version``
  row of the store's ``settings`` key/value table (no new table, no migration; the release before 0.2.0 reads
  that table by the keys it knows and ignores this one). A database that has no such row yet (0.1.0 led it) is
  read from the control planes' rows (``controlplanes``, which every release writes its version into): the one
  seen last, this instance's own row from before its restart included.
- ``ControlPlaneVersionSkew`` (``control plane cp2 runs 0.1.0, the leader 0.2.0``): the leader sees a live
  control plane at another version (a standby not upgraded yet, or one started from an old install); told
  once per control plane and version, while this one leads.

Only the leader tells (events are written by the leader); the checks read the store on its thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from llmgw.control import events as ev
from llmgw.control.leader import Instance
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import StoredControlPlane

log = logging.getLogger(__name__)

#: The key of the ``settings`` row holding the version the last leader ran.
KEY = "controlplane_version"
#: How often the leader looks at the other control planes' versions (their rows are read each lease round).
CHECK_S = 2.0


def last_leader_version(settings: dict[str, str], rows: Iterable[StoredControlPlane], version: str = "") -> str:
    """The version the cluster's last leader ran: the ``settings`` row, else the control plane row seen last at
    another version than ``version`` (the one taking the lease now); "" when neither says.

    No ``settings`` row means a release before 0.2.0 led (every later leader writes one when elected), so the
    last leader ran another version than this one: a row at this one's version is a standby upgraded before the
    failover (this very control plane, most likely, its row beaten while it stood by) and says nothing of who led.
    """
    if settings.get(KEY):
        return settings[KEY]
    seen = [r for r in rows if r.version and r.version != version]
    return max(seen, key=lambda r: r.last_seen).version if seen else ""


class Versions:
    """Tells version changes and skews among control planes as events; ``record`` is the cluster's."""

    def __init__(self, me_id: str, version: str, record: Callable[[ev.Event], None],
                 clock: Callable[[], float]) -> None:
        self.me_id, self.version, self._record, self._clock = me_id, version, record, clock
        #: (control plane id, version) already told as a skew while this one leads.
        self._told: set[tuple[str, str]] = set()

    async def elected(self, db: StoreThread) -> None:
        """On taking the lease: the change from the last leader's version, told, and this one's kept."""
        self._told = set()
        store = db.store
        was = last_leader_version(await db.call(store.settings), await db.call(store.list_controlplanes),
                                  self.version)
        if was and was != self.version:
            self._record(ev.Event(self._clock(), ev.NORMAL, "ControlPlaneVersionChanged", f"controlplane/{self.me_id}",
                                  f"control plane {was} → {self.version} ({self.me_id} leads now)"))
            log.warning("the cluster's leader was at llmgw %s; this control plane (%s) leads at %s", was, self.me_id,
                        self.version)
        if was != self.version:
            await db.call(store.put_settings, {KEY: self.version})

    def check(self, instances: Iterable[Instance]) -> None:
        """Tells each live control plane at another version than this leader's, once per version it runs."""
        for cp in instances:
            if cp.id == self.me_id or cp.role == "gone" or not cp.version or cp.version == self.version:
                continue
            if (cp.id, cp.version) in self._told:
                continue
            self._told.add((cp.id, cp.version))
            self._record(ev.Event(self._clock(), ev.NORMAL, "ControlPlaneVersionSkew", f"controlplane/{cp.id}",
                                  f"control plane {cp.id} runs {cp.version}, the leader {self.version}"))

    async def watch(self, leading: Callable[[], bool], instances: Callable[[], list[Instance]]) -> None:
        """Runs ``check`` every ``CHECK_S`` while this control plane leads, for the server's life."""
        while True:
            await asyncio.sleep(CHECK_S)
            if leading():
                self.check(instances())
