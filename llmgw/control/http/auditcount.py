"""Refusals that come in floods, counted in one audit row per address, reason and minute.

Found by an attacker's probe: every rate-limited anonymous login (429) added a row, 1,000 rows in
2.9 s, to a table nothing pruned. The first such refusal from an address in a minute writes a row; the
next ones in that minute only count, and the row's detail is rewritten with the count ("37 refused
logins from 10.0.0.9 …"). A rewrite is queued only when none is waiting, so a flood costs one write
per store turn, not one per request. Each control plane counts what it answered; with several, an
address that reaches more than one gets a row on each.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread

#: The window a row counts refusals in.
WINDOW_S = 60.0
#: Names tried shown in a counting row's detail (an attacker's list of names is not worth more).
NAMES_SHOWN = 5


@dataclasses.dataclass(slots=True)
class _Window:
    """One counting row: its id once written, how many refusals, and whether a rewrite is queued."""

    address: str
    action: str
    reason: str
    message: str
    started: float
    count: int = 1
    names: list[str] = dataclasses.field(default_factory=list)
    entry_id: int = 0
    queued: bool = True


class RefusalCounts:
    """Counts refusals per (address, reason) per ``window_s``; call ``refused`` on the event loop."""

    def __init__(self, db: StoreThread, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time) -> None:
        self._db, self._window_s, self._clock = db, window_s, clock
        self._open: dict[tuple[str, str, str, int], _Window] = {}
        self._lock = threading.Lock()  # the store's thread reads what the loop counts

    def refused(self, *, address: str, action: str, reason: str, message: str, name: str = "") -> None:
        """One more refusal of ``action`` (``reason``: the error's code) from ``address``."""
        now = self._clock()
        slot = int(now // self._window_s)
        key = (address, action, reason, slot)
        first = again = False
        with self._lock:
            for old in [k for k in self._open if k[3] < slot - 1]:
                del self._open[old]  # a window two back is closed; its row holds its final count
            w = self._open.get(key)
            if w is None:
                w = self._open[key] = _Window(address, action, reason, message, now)
                first = True
            else:
                w.count += 1
                again = not w.queued and w.entry_id != 0
                if again:
                    w.queued = True
            if name and name not in w.names and len(w.names) < NAMES_SHOWN:
                w.names.append(name)
        if first:
            self._db.submit(self._write_first, self._db.store, w)
        elif again:
            self._db.submit(self._rewrite, self._db.store, w)

    def detail(self, w: _Window) -> str:
        names = f"; names tried: {', '.join(w.names)}" if w.names else ""
        at = time.strftime("%H:%M:%S", time.gmtime(w.started))
        plural = "s" if w.count != 1 else ""
        return (f"{w.count} refused {w.action}{plural} from {w.address} in the {self._window_s:g} s from {at} UTC "
                f"({w.reason}: {w.message}){names}")

    def _write_first(self, store: store_mod.Store, w: _Window) -> None:
        with self._lock:
            detail = self.detail(w)
            first_name = w.names[0] if w.names else "?"
        entry = store.record_audit(actor=w.address, action=w.action, object=f"user/{first_name}",
                                   outcome="refused", detail=detail, at=w.started)
        with self._lock:
            w.entry_id = entry.id
            w.queued = False
            behind = self.detail(w) != detail
            if behind:
                w.queued = True
        if behind:  # refusals counted while the row was written
            self._rewrite(store, w)

    def _rewrite(self, store: store_mod.Store, w: _Window) -> None:
        with self._lock:
            w.queued = False
            detail = self.detail(w)
        store.set_audit_detail(w.entry_id, detail)
