"""Usage and ledger retention: once a minute the leader deletes rollups past their grain's retention,
request-log rows past theirs, and ledger rows of periods that ended over a day ago (``auditprune``'s pattern).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.usage.config import UsageConfig

log = logging.getLogger(__name__)
EVERY_S = 60.0


def prune(store: store_mod.Store, cfg: UsageConfig, *, now: float) -> int:
    gone = store.prune_usage(now=now, minute_retention_s=cfg.minute_retention_s, hour_retention_s=cfg.hour_retention_s,
                             day_retention_s=cfg.day_retention_s, request_log_retention_s=cfg.request_log_retention_s)
    gone += store.prune_quota(now=now)
    if gone:
        log.info("pruned %d usage and quota rows past their retention", gone)
    return gone


async def run(db: StoreThread, cfg: UsageConfig, *, leading: Callable[[], bool],
              clock: Callable[[], float] = time.time, every_s: float = EVERY_S) -> None:
    """Prunes while this control plane leads, until cancelled."""
    while True:
        if leading():
            try:
                await db.call(prune, db.store, cfg, now=clock())
            except Exception as e:
                if not (why := store_mod.unreachable(e)):
                    raise
                log.warning("usage not pruned: the database did not answer (%s)", why)
        await asyncio.sleep(every_s)
