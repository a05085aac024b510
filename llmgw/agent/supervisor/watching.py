"""The monitor: one task per shard, from launch (or adoption) until its process exits.

While the shard is STARTING it asks readiness every interval; once READY it
asks liveness every ``probe_period_s`` (``liveness`` decides what each answer
means: READY with a failure counted, UNHEALTHY, READY again), all the while
racing the process's exit. An exit that no stop asked for is a failure,
reported with the exit code and the end of the engine's own output, because
"exited with code 1" alone sends someone to ssh into the node to find out why.
An exit during a stop is left to the stop, which reports STOPPED.

Launched and adopted engines are watched by the same code: the differences
(an exit found by polling, no exit code) are the ``EngineProcess``'s. An
adopted engine gets ``adopt_timeout_s`` to answer the readiness probe, far
less than a startup timeout: it is not loading, so it either serves or it does
not, and one that does not is given up on (stopped, then FAILED). Left
STARTING, the control plane would wait out the profile's startup timeout
(minutes) before replacing it.

A worker rank that serves no HTTP (vLLM's headless ranks, SGLang's ranks
past 0) has nothing to ask: it is READY once it has stayed alive
``worker_settle_s`` (a bad flag or a missing library ends it within a second
or two, and that is reported as FAILED with its output, not as READY), and is
then watched for its exit alone. Probed like a leader, it would sit STARTING
until the control plane's startup timeout replaced a healthy rank.

Asks never block the loop and never pile up: each is one awaited request with
its own timeout, and the next is not sent before the last has ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from llmgw.agent.supervisor import liveness, probing, process, records
from llmgw.core.shards import ShardState

log = logging.getLogger(__name__)
S = ShardState
#: Why an adopted engine's exit comes without a code (kept here too: tests and callers read it from watching).
ADOPTED_EXIT = process.ADOPTED_EXIT
#: How long a worker rank that serves no HTTP must stay alive to be READY.
WORKER_SETTLE_S = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    """How every shard is watched: the supervisor's settings, given once."""

    #: Between readiness asks while a shard is STARTING.
    interval_s: float = 0.5
    #: How long an adopted engine has to answer before it is given up on.
    adopt_timeout_s: float = 60.0
    #: How a READY engine's health is probed.
    live: liveness.Liveness = dataclasses.field(default_factory=liveness.Liveness)
    clock: Callable[[], float] = time.monotonic
    #: How long a worker rank that serves no HTTP must stay alive to be READY.
    worker_settle_s: float = WORKER_SETTLE_S


async def _until_ready(rec: records.Shard, engine: process.EngineProcess, exited: asyncio.Future[Any], *,
                       recs: records.Records, timing: Timing, deadline: float | None = None) -> tuple[bool, str]:
    """Probe until READY (True), or until the exit, a move away from STARTING or ``deadline`` (False).

    Also returns what the last probe found missing ("" when none did).
    """
    clock = timing.clock
    said: str | None = None
    while rec.status.state is S.STARTING and not exited.done():
        timeout_s = probing.PROBE_TIMEOUT_S
        if deadline is not None:
            if clock() >= deadline:
                return False, said or ""
            # A probe hung on a frozen engine must not carry us far past the deadline.
            timeout_s = max(0.1, min(timeout_s, deadline - clock()))
        probe = asyncio.ensure_future(engine.check_ready(timeout_s=timeout_s))
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
            log.warning("probing shard %s failed: %r", rec.status.shard_id, probe.exception())
        elif (missing := probe.result()) is None:
            # An adopted engine may have been put to sleep before this agent started (spec.idle): it says so,
            # not its level (1 then: the one that keeps the weights), and the control plane routes nothing to it.
            level = 1 if (rec.status.adopted and engine.spec.sleep_mode and await engine.is_sleeping()) else 0
            if rec.status.state is S.STARTING and not exited.done():
                what = "adopted engine answers" if rec.status.adopted else "ready"
                asleep = ", asleep" if level else ""
                recs.move(rec, S.READY, message=f"{what} after {clock() - rec.started_at:.1f} s{asleep}", adopted=False,
                          sleep_level=level)
                return True, ""
            return False, ""
        elif missing != said:
            log.debug("shard %s is not ready: %s", rec.status.shard_id, missing)
            said = missing
        await asyncio.wait({exited}, timeout=timing.interval_s)
    return False, said or ""


async def _follow(rec: records.Shard, engine: process.EngineProcess, exited: asyncio.Future[Any], *,
                  recs: records.Records, live: liveness.Liveness) -> None:
    """Ask a ready engine's health every period, one ask at a time, until it exits or leaves READY/UNHEALTHY."""
    loop = asyncio.get_running_loop()
    next_at = loop.time() + live.period_s
    while True:
        await asyncio.wait({exited}, timeout=max(0.0, next_at - loop.time()))
        if exited.done() or rec.status.state not in liveness.PROBED:
            return  # a drain or a stop has it now, and nothing moves it back to READY
        # Start to start: an ask that times out is followed by the next at once,
        # so a hang is found in about threshold * max(period, timeout).
        next_at = loop.time() + live.period_s
        ask = asyncio.ensure_future(engine.probe(timeout_s=live.timeout_s))
        try:
            await asyncio.wait({ask, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not ask.done():
                ask.cancel()
        if exited.done() or ask.cancelled():
            return
        if (exc := ask.exception()) is not None:
            log.warning("the health probe of shard %s raised %r", rec.status.shard_id, exc)
            problem: str | None = f"the probe itself failed ({type(exc).__name__}: {exc})"
        else:
            problem = ask.result()
        if problem is not None and not engine.running():
            # It died while we asked (the connection was refused a moment before
            # its exit is seen): that is an exit, the caller reports it as one.
            return
        lines = engine.tail() if problem is not None else ()
        verdict = liveness.judge(rec.status, problem, liveness=live, pid=engine.pid,
                                 last_line=lines[-1] if lines else "")
        if verdict is None:
            continue
        changes: dict[str, Any] = {"probe_failures": verdict.probe_failures, "message": verdict.message}
        if verdict.with_output:
            changes["last_output"] = lines
        elif verdict.state is S.READY and verdict.probe_failures == 0:
            changes["last_output"] = ()  # the hang's output was the problem's, not this READY's
        recs.move(rec, verdict.state, report=verdict.report, **changes)


async def _settle(rec: records.Shard, exited: asyncio.Future[Any], *, recs: records.Records,
                  timing: Timing) -> bool:
    """A worker rank: READY (True) once it has stayed alive ``worker_settle_s``; False when it exited first."""
    await asyncio.wait({exited}, timeout=timing.worker_settle_s)
    if exited.done() or rec.status.state is not S.STARTING:
        return False
    what = "adopted worker rank is alive" if rec.status.adopted else "worker rank is alive"
    recs.move(rec, S.READY, message=f"{what} after {timing.clock() - rec.started_at:.1f} s (it serves no HTTP; "
              "the replica's leader answers for it)", adopted=False)
    return True


def _when(rec: records.Shard) -> str:
    return "after it was ready" if rec.was_ready else "before it was ready"


async def watch(rec: records.Shard, *, recs: records.Records, timing: Timing,
                give_up: Callable[[records.Shard, str], None]) -> None:
    """READY when the engine serves, then its liveness; FAILED if it exits unasked.

    An adopted engine that does not answer within ``adopt_timeout_s`` goes to
    ``give_up`` (which stops it, and reports FAILED once it is gone).
    """
    engine = rec.engine
    assert engine is not None
    exited = asyncio.ensure_future(engine.wait())
    try:
        if engine.serves_http:
            if not await _serve(rec, engine, exited, recs=recs, timing=timing, give_up=give_up):
                return  # given up on: the stop reports how it ended
        else:
            # Nothing to probe: alive is all a worker rank can say; its exit is what is watched.
            await _settle(rec, exited, recs=recs, timing=timing)
        await exited
    finally:
        exited.cancel()
    if rec.stopping is not None:
        return
    engine.sweep()
    lines = engine.tail()
    last = f": {lines[-1]}" if lines else "; it wrote no output"
    recs.move(rec, S.FAILED, message=f"{engine.describe_exit()} {_when(rec)}{last}",
              exit_code=engine.exit_code, last_output=lines)
    await engine.remove_work_dir()


async def _serve(rec: records.Shard, engine: process.EngineProcess, exited: asyncio.Future[Any], *,
                 recs: records.Records, timing: Timing, give_up: Callable[[records.Shard, str], None]) -> bool:
    """An engine that serves HTTP: READY when it answers, then its liveness; False when it was given up on."""
    deadline = rec.started_at + timing.adopt_timeout_s if engine.adopted else None
    ready, missing = await _until_ready(rec, engine, exited, recs=recs, timing=timing, deadline=deadline)
    if (engine.adopted and not ready and rec.status.state is S.STARTING and not exited.done()
            and rec.stopping is None):
        last = f" (last: {missing})" if missing else ""
        give_up(rec, f"adopted engine did not answer within {timing.adopt_timeout_s:g} s{last}; it was stopped")
        return False
    if ready:
        await _follow(rec, engine, exited, recs=recs, live=timing.live)
    return True
