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

Python never starts a full collection by itself here (``NO_AUTOMATIC_FULL``):
the freezes above are the only ones. Freezing alone did not keep them short
under REST load. Each agent's stream always has a read in flight, about 15
tracked objects (a coroutine, its Future and iterator, grpc's batch tag and
callback wrappers, the last AgentMessage, the fresh Inventory): 150,000 at
10,000 agents, each living one heartbeat period (5 s) and then freed by
reference counting. Idle they never meet a collection; a REST client paging
events makes the young collections run 90-190 times a second, which promote
every one of them to the oldest generation, and Python's full collections
(every 100 middle ones) then walked them: measured 4-11 of 150-250 ms in a
60 s window at 10,000 agents, every thread stopped, heartbeat p99 84-146 ms (in
other runs none: it depends on when Python's rule for a full one is met).
Freezing every 10 s could not help: the set is a new one every 5 s. What a
full collection would find is cyclic garbage old enough to be promoted:
8,000-11,000 objects a minute measured, collected by the next freeze instead,
whose collection (the in-flight reads are not frozen yet) is the one pause of
150-200 ms a minute left.
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
#: The oldest generation's threshold (middle collections between full ones): never reached in practice.
NO_AUTOMATIC_FULL = 1 << 30
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


def no_automatic_full() -> None:
    """Young and middle collections as they were; a full one only when ``freeze`` asks (module docstring)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NO_AUTOMATIC_FULL)


async def manage(*, check_s: float = 1.0) -> None:
    """Runs until cancelled: freezes at start, then as the module docstring says."""
    if os.environ.get("LLMGW_GC_FREEZE", "1") == "0":
        log.info("LLMGW_GC_FREEZE=0: garbage collection left to Python's defaults")
        return
    no_automatic_full()
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
