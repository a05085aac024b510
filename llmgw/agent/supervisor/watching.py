"""The monitor: one task per shard, from launch until its process exits.

While the shard is STARTING it probes readiness every interval; once READY it
only waits for the exit. An exit that no stop asked for is a failure, reported
with the exit code and the end of the engine's own output, because "exited
with code 1" alone sends someone to ssh into the node to find out why. An exit
during a stop is left to the stop, which reports STOPPED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from llmgw.agent.supervisor import ending, launching, probing, records
from llmgw.core.shards import ShardState

log = logging.getLogger(__name__)
S = ShardState


async def _until_ready(rec: records.Shard, plan: launching.Plan, exited: asyncio.Future[int], *,
                       recs: records.Records, http: Callable[[], aiohttp.ClientSession],
                       interval_s: float, clock: Callable[[], float]) -> None:
    spec = rec.status.spec
    assert spec is not None
    said: str | None = None
    while rec.status.state is S.STARTING and not exited.done():
        probe = asyncio.ensure_future(probing.probe(
            http(), plan.endpoint, health_path=plan.health_path,
            served_name=spec.served_name, api_key=spec.api_key))
        try:
            # Raced against the exit: an engine that dies while a probe hangs on
            # its half-open socket is reported now, not at the probe's timeout.
            await asyncio.wait({probe, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unfinished = not probe.done()
            if unfinished:
                probe.cancel()
        if unfinished:
            break  # the process exited first
        if probe.exception() is not None:
            # Not ready, and not the end of watching: the exit must still be seen.
            log.warning("probing shard %s failed: %r", spec.shard_id, probe.exception())
        elif (missing := probe.result()) is None:
            if rec.status.state is S.STARTING and not exited.done():
                recs.move(rec, S.READY, message=f"ready after {clock() - rec.started_at:.1f} s")
            return
        elif missing != said:
            log.debug("shard %s is not ready: %s", spec.shard_id, missing)
            said = missing
        await asyncio.wait({exited}, timeout=interval_s)


async def watch(rec: records.Shard, proc: asyncio.subprocess.Process, plan: launching.Plan, *,
                recs: records.Records, http: Callable[[], aiohttp.ClientSession],
                interval_s: float, clock: Callable[[], float]) -> None:
    """Report READY when the engine serves, and FAILED if it exits unasked."""
    exited = asyncio.ensure_future(proc.wait())
    try:
        await _until_ready(rec, plan, exited, recs=recs, http=http, interval_s=interval_s, clock=clock)
        code = await exited
    finally:
        exited.cancel()
    if rec.stopping is not None:
        return
    ending.sweep_group(proc.pid)
    lines = ending.tail(plan.log_path, rec.log_offset)
    when = "after it was ready" if rec.status.state is S.READY else "before it was ready"
    last = f": {lines[-1]}" if lines else "; it wrote no output"
    recs.move(rec, S.FAILED, message=f"engine {ending.describe_exit(code)} {when}{last}",
              exit_code=code, last_output=lines)
