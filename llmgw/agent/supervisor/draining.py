"""A drain: wait until the engine holds no request, so that the stop that follows fails none.

The control plane takes a DRAINING shard out of the router's table first, so
no new request reaches it; what it still holds are the requests already in
flight, which the engine itself counts. The count is asked every 0.25 s
through the shard's ``EngineProcess`` (where to ask is the adapter's
``in_flight_probe``), and the shard is DRAINED at the first answer of 0 or
when the timeout passes, and the message says which. An answer that is not a
count (an engine without the endpoint, an error, no answer) is never taken
for 0: a drain that guessed would stop the engine under a stream, so it waits
the timeout out instead. A drained engine keeps running: stopping it is the
next command.

An UNHEALTHY shard is drained too, and the same way: a hung engine answers no
count, so its drain ends at the timeout, never later, and the stop that
follows kills it after the grace (a frozen process ignores SIGTERM). It is not
cut short: an engine that was only slow may still finish what it holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmgw.agent import engines
from llmgw.agent.supervisor import probing, records
from llmgw.core.shards import ShardState, ShardStatus

S = ShardState
#: How often a draining engine is asked what it still holds.
POLL_S = 0.25


def probe_of(adapter: engines.Adapter) -> engines.InFlightProbe | None:
    """The adapter's in-flight probe; None for an adapter written before there was one."""
    probe = getattr(adapter, "in_flight_probe", None)
    return probe() if probe is not None else None


async def drain(rec: records.Shard, *, recs: records.Records, timeout_s: float, clock: Callable[[], float],
                poll_s: float = POLL_S) -> ShardStatus:
    """Poll until nothing is in flight or ``timeout_s`` passes, then DRAINED; any other move ends it early."""
    engine = rec.engine
    assert engine is not None
    began = clock()
    while rec.status.state is S.DRAINING:
        # Each ask is bounded, so a hung engine (an UNHEALTHY one, say) costs
        # the drain its timeout and no more: it never answers, and never gets to 0.
        count, said = await engine.in_flight(timeout_s=min(probing.PROBE_TIMEOUT_S, max(poll_s, timeout_s)))
        if rec.status.state is not S.DRAINING:
            break  # stopped, or exited, while we asked
        waited = clock() - began
        if count == 0:
            return recs.move(rec, S.DRAINED, message=f"drained: nothing in flight after {waited:.1f} s")
        left = timeout_s - waited
        if left <= 0:
            if count is None:
                why = f"the engine never said how many requests it holds ({said}); some may still be in flight"
            else:
                why = f"{count} request{'' if count == 1 else 's'} still in flight; stopping it now fails them"
            return recs.move(rec, S.DRAINED, message=f"drain timed out after {timeout_s:g} s; {why}")
        await asyncio.sleep(min(poll_s, left))
    return rec.status
