"""The monitor: one task per shard, from launch (or adoption) until its process exits.

While the shard is STARTING it probes readiness every interval; once READY it
only waits for the exit. An exit that no stop asked for is a failure, reported
with the exit code and the end of the engine's own output, because "exited
with code 1" alone sends someone to ssh into the node to find out why. An exit
during a stop is left to the stop, which reports STOPPED.

An adopted engine (started by a previous agent) is watched the same way, but
its exit is found by polling, since it is not our child, and it has no exit
code to report. It gets ``adopt_timeout_s`` to answer the probe, far less than
a startup timeout: it is not loading, so it either serves or it does not, and
one that does not is stopped and FAILED here. Left STARTING, the control plane
would wait out the profile's startup timeout (minutes) before replacing it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from llmgw.agent.supervisor import ending, launching, orphans, probing, records
from llmgw.core.shards import ShardState

log = logging.getLogger(__name__)
S = ShardState
#: Why an adopted engine's exit comes without a code.
ADOPTED_EXIT = "engine exited (exit code unknown: it was started by a previous agent)"


async def _until_ready(rec: records.Shard, plan: launching.Plan, exited: asyncio.Future[Any], *,
                       recs: records.Records, http: Callable[[], aiohttp.ClientSession],
                       interval_s: float, clock: Callable[[], float],
                       deadline: float | None = None) -> tuple[bool, str]:
    """Probe until READY (True), or until the exit, a move away from STARTING or ``deadline`` (False).

    Also returns what the last probe found missing ("" when none did).
    """
    spec = rec.status.spec
    assert spec is not None
    said: str | None = None
    while rec.status.state is S.STARTING and not exited.done():
        timeout_s = probing.PROBE_TIMEOUT_S
        if deadline is not None:
            if clock() >= deadline:
                return False, said or ""
            # A probe hung on a frozen engine must not carry us far past the deadline.
            timeout_s = max(0.1, min(timeout_s, deadline - clock()))
        probe = asyncio.ensure_future(probing.probe(
            http(), plan.endpoint, health_path=plan.health_path,
            served_name=spec.served_name, api_key=spec.api_key, timeout_s=timeout_s))
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
                what = "adopted engine answers" if rec.status.adopted else "ready"
                recs.move(rec, S.READY, message=f"{what} after {clock() - rec.started_at:.1f} s", adopted=False)
                return True, ""
            return False, ""
        elif missing != said:
            log.debug("shard %s is not ready: %s", spec.shard_id, missing)
            said = missing
        await asyncio.wait({exited}, timeout=interval_s)
    return False, said or ""


def _when(rec: records.Shard) -> str:
    return "after it was ready" if rec.was_ready else "before it was ready"


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
    last = f": {lines[-1]}" if lines else "; it wrote no output"
    recs.move(rec, S.FAILED, message=f"engine {ending.describe_exit(code)} {_when(rec)}{last}",
              exit_code=code, last_output=lines)


async def watch_adopted(rec: records.Shard, orphan: orphans.Orphan, plan: launching.Plan, *,
                        recs: records.Records, http: Callable[[], aiohttp.ClientSession],
                        interval_s: float, clock: Callable[[], float], adopt_timeout_s: float,
                        give_up: Callable[[records.Shard, str], None]) -> None:
    """READY once the adopted engine answers; ``give_up`` if it does not in time; FAILED if it exits."""
    exited = asyncio.ensure_future(orphan.wait(interval_s=interval_s))
    try:
        ready, missing = await _until_ready(rec, plan, exited, recs=recs, http=http, interval_s=interval_s,
                                            clock=clock, deadline=rec.started_at + adopt_timeout_s)
        if not ready and rec.status.state is S.STARTING and not exited.done() and rec.stopping is None:
            last = f" (last: {missing})" if missing else ""
            give_up(rec, f"adopted engine did not answer within {adopt_timeout_s:g} s{last}; it was stopped")
            return
        await exited
    finally:
        exited.cancel()
    if rec.stopping is not None:
        return
    orphan.sweep()
    lines = ending.tail(plan.log_path, rec.log_offset)
    last = f": {lines[-1]}" if lines else "; it wrote no output"
    recs.move(rec, S.FAILED, message=f"{ADOPTED_EXIT} {_when(rec)}{last}", last_output=lines)
