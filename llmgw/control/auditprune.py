"""The audit log's retention: the leader deletes entries older than ``--audit-retention`` (90 days by default).

Found by an attacker's probe: nothing ever pruned the audit table, so a flood of refused requests grew
it without end. Only the leader prunes, and through the store's fenced transaction like every leader
write: a deposed leader that wakes up deletes nothing. A pass runs at start and then every
``every_s(retention)``, a tenth of the retention, at most hourly, at least every second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread

log = logging.getLogger(__name__)

#: How long entries are kept unless ``llmgw server --audit-retention`` says otherwise.
DEFAULT_RETENTION_S = 90 * 86400.0


def every_s(retention_s: float) -> float:
    """Seconds between two passes: a tenth of the retention, within [1 s, 1 h]."""
    return min(3600.0, max(1.0, retention_s / 10))


def prune(store: store_mod.Store, *, retention_s: float, now: float) -> int:
    """Deletes the entries older than ``retention_s``; how many. Nothing when fenced (not the leader)."""
    try:
        gone = store.prune_audit(before=now - retention_s)
    except store_mod.Fenced as e:
        log.info("audit entries not pruned: %s", e)
        return 0
    if gone:
        log.info("pruned %d audit entries older than %.0f s (--audit-retention)", gone, retention_s)
    return gone


async def run(db: StoreThread, *, retention_s: float, leading: Callable[[], bool],
              clock: Callable[[], float] = time.time) -> None:
    """Prunes while this control plane leads, until cancelled."""
    while True:
        if leading():
            try:
                await db.call(prune, db.store, retention_s=retention_s, now=clock())
            except Exception as e:
                if not (why := store_mod.unreachable(e)):
                    raise
                log.warning("audit entries not pruned: the database did not answer (%s)", why)
        await asyncio.sleep(every_s(retention_s))
