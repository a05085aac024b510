"""A sleep or a wake of a READY shard's engine, through the engine's own API (issue 31, ``spec.idle``).

The control plane decides (``core/idle.py``), the agent acts: it asks its engine (``probing.sleep``:
vLLM's ``POST /sleep?level=N`` and ``POST /wake_up``), and reports the shard READY with its
``sleep_level`` (0: awake) once the engine answered. The process stays: its pid does not change, and
a level-1 sleeper keeps its weights in host memory. A refusal (an engine started without its sleep
mode, one that does not answer) leaves the level as it was and says why in the shard's message; the
control plane then stops the replica instead (the idle rule for an engine that cannot sleep).
Only a READY shard of an engine that serves HTTP sleeps: anything else is reported as it is.
"""

from __future__ import annotations

from llmgw.agent.supervisor import records
from llmgw.core.shards import ShardState, ShardStatus

S = ShardState


async def sleep(rec: records.Shard, *, recs: records.Records, level: int) -> ShardStatus:
    """Sleep at ``level`` (1, 2) or wake (0); the shard's status once the engine answered (or refused)."""
    async with rec.sleep_lock:
        engine = rec.engine
        if rec.status.state is not S.READY or engine is None or not engine.serves_http:
            return rec.status
        if rec.status.sleep_level == level:
            return rec.status  # idempotent: asked again (a resent command)
        problem = await engine.sleep(level)
        if rec.status.state is not S.READY:
            return rec.status  # stopped or exited while it was asked
        if problem is not None:
            verb = f"sleep at level {level}" if level else "wake"
            return recs.move(rec, S.READY, message=f"cannot {verb}: {problem}")
        message = (f"asleep at level {level}: its accelerator memory freed, its process kept" if level
                   else "awake: woken from sleep")
        return recs.move(rec, S.READY, sleep_level=level, message=message)
