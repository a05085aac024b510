"""Garbage collection for a control plane holding thousands of agent streams.

Each connected agent costs the server about 130 objects the collector tracks
(a grpc.aio call, its tasks, coroutines and futures, the node's inventory), so
10,000 agents are over a million. Python's full collection walks all of them
and stops every thread while it does: measured at 0.5–1.1 s with 10,000
agents, every 15 s or so, because every heartbeat leaves new long-lived
objects (the node's fresh inventory) that count towards the next one. Every
heartbeat that arrived in such a pause waited for it.

So the survivors are frozen (``gc.freeze``): moved out of every later
collection, so a full collection walks only what was created since the last
freeze. That happens after every ``BURST`` registrations (one collection of
what is not frozen yet, tens of milliseconds) and every ``FREEZE_S`` (the
heartbeats' leftovers). Frozen objects are still freed by reference counting
(a replaced inventory goes at once); only a cycle among them that becomes
garbage later is kept, for instance the task of a stream that ended. To bound
that, every ``REFREEZE_S`` everything is unfrozen, collected and frozen again:
one full pause every half hour at a moment of our choosing, instead of one
every 15 s.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time

log = logging.getLogger(__name__)

#: Registrations since the last freeze that call for the next one.
BURST = 500
FREEZE_S = 60.0
FULL_EVERY = 100
REFREEZE_S = 1800.0

_registered = [0]  # since the last freeze


def note_registration() -> None:
    _registered[0] += 1


def freeze(*, full: bool) -> None:
    """Collects what is not frozen (``full``: everything, one full pause), then freezes the survivors."""
    t0 = time.perf_counter()
    if full:
        gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    _registered[0] = 0
    log.debug("garbage collection: %d objects frozen, %d collected, %.0f ms%s", gc.get_freeze_count(),
              collected, (time.perf_counter() - t0) * 1000, " (full)" if full else "")


async def manage(*, check_s: float = 1.0) -> None:
    """Runs until cancelled: freezes at start, then as the module docstring says."""
    if os.environ.get("LLMGW_GC_FREEZE", "1") == "0":
        log.info("LLMGW_GC_FREEZE=0: garbage collection left to Python's defaults")
        return
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_EVERY)
    freeze(full=True)
    last = last_full = time.monotonic()
    while True:
        await asyncio.sleep(check_s)
        now = time.monotonic()
        if now - last_full >= REFREEZE_S:
            freeze(full=True)
            last = last_full = now
        elif _registered[0] >= BURST or now - last >= FREEZE_S:
            freeze(full=False)
            last = now
