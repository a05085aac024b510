"""Keys' "last used", written to the store by the leader, at most once every few seconds per key.

Routers report the newest use of each key (``router.keyuse``, as ``key_used`` events that
``routerreports.RouterEvents`` hands to ``Writer.note``). Each router already reports a key at most every
few seconds; with several routers the same key arrives from each, so the writer coalesces again
(``core.latest``): a key gets one write per interval, carrying the newest time from every router.

Only the leader writes (the store's fence refuses anyone else's write anyway): a standby's note is
dropped. A time ahead of this control plane's clock is cut to now, so one router with a clock
running fast cannot make a key look used in the future.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.core import latest

log = logging.getLogger(__name__)

#: Seconds between two writes of the same key's last use.
EVERY_S = 5.0


class Writer:
    """Turns key-use reports into ``Store.touch_keys`` writes, one per key per ``every_s`` at most."""

    def __init__(self, db: StoreThread, *, leading: Callable[[], bool], every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._leading = leading
        self._clock = clock
        self._latest = latest.Latest(every_s=every_s)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def note(self, key_id: str, at: float) -> None:
        """A router saw ``key_id`` used ``at`` (wall clock); call it on the event loop."""
        if not self._leading():
            return
        now = self._clock()
        delay = self._latest.offer(key_id, min(at, now), now=now)
        if delay is None:
            return
        if delay <= 0:
            self._write(key_id)
        else:
            self._timers[key_id] = asyncio.get_running_loop().call_later(delay, self._write, key_id)

    def _write(self, key_id: str) -> None:
        self._timers.pop(key_id, None)
        at = self._latest.take(key_id, now=self._clock())
        if at is not None and self._leading():
            self._db.submit(_touch, self._db.store, {key_id: at})

    def close(self) -> None:
        """Writes what is pending now and stops the timers."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        pending = self._latest.take_all(now=self._clock())
        if pending and self._leading():
            self._db.submit(_touch, self._db.store, pending)


def _touch(store: store_mod.Store, used: dict[str, float]) -> None:
    try:
        store.touch_keys(used)
    except store_mod.Fenced as e:
        # Deposed between the note and the write: the new leader gets the next report.
        log.info("a key's last use was not written: %s", e)
    except Exception as e:
        if not (why := store_mod.unreachable(e)):
            raise
        log.warning("a key's last use was not written: the database did not answer (%s)", why)
