"""The supervisor's memory: one record per shard, and the one place a shard's state changes.

``Records.move`` is the only writer of a shard's status, so "``on_status`` hears
each transition exactly once" is a property of one function rather than of
every code path that might change a state. Terminal shards are kept so that a
repeated command still gets its answer, but only the latest ``max_terminal``,
and a forgotten shard's log is removed with it: an agent that runs for months
would otherwise remember (and keep the output of) every shard it ever ran.
A shard's state file goes when it ends, here too: it is the next agent's
evidence that the process runs, and an ended shard's would be false.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llmgw.agent.supervisor import launching, process, statefiles
from llmgw.core.shards import ShardState, ShardStatus

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Shard:
    """One shard as the supervisor holds it; the tasks are owned here, not by callers."""

    status: ShardStatus
    started_at: float
    starting: asyncio.Task[ShardStatus] | None = None
    stopping: asyncio.Task[ShardStatus] | None = None
    monitor: asyncio.Task[None] | None = None
    draining: asyncio.Task[ShardStatus] | None = None
    #: Its engine's process, launched or adopted; None until the launch has one (or when it failed to).
    engine: process.EngineProcess | None = None
    plan: launching.Plan | None = None
    #: Its state file while the process may run; removed (and None) once it has ended.
    state_path: Path | None = None
    #: Whether it was ever READY (a drained engine that exits failed "after it was ready").
    was_ready: bool = False
    #: Its LoRA adapters' keeper (``loras.Keeper``) and the task running it; None: its spec lists none.
    loras: Any = None
    lora_task: asyncio.Task[None] | None = None
    #: Held while a sleep or a wake is asked of its engine, so two never overlap.
    sleep_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    def has_process(self) -> bool:
        return self.engine is not None

    def tasks(self) -> Iterator[asyncio.Task[Any]]:
        for task in (self.starting, self.stopping, self.monitor, self.draining, self.lora_task):
            if task is not None and not task.done():
                yield task


class Records:
    """Shards by id, with a bounded memory of the ended ones."""

    def __init__(self, on_status: Callable[[ShardStatus], None], *, max_terminal: int = 100) -> None:
        self._on_status = on_status
        self._shards: dict[str, Shard] = {}
        self._ended: collections.deque[str] = collections.deque()
        self._max_terminal = max_terminal

    def get(self, shard_id: str) -> Shard | None:
        return self._shards.get(shard_id)

    def add(self, rec: Shard) -> None:
        self._shards[rec.status.shard_id] = rec

    def all(self) -> list[Shard]:
        return list(self._shards.values())

    def move(self, rec: Shard, state: ShardState, *, report: bool = True, quiet: bool = False,
             **changes: object) -> ShardStatus:
        """Record a transition and tell ``on_status``, once; ``report=False`` records without telling.

        ``quiet`` tells without an INFO line: a fetch's progress, once a second
        for hours, would bury every other line of the agent's log.

        ``probe_failures`` counts only in READY and UNHEALTHY: a stopping or
        draining shard that still said "2 failed" would read as a live problem.
        """
        if state not in (ShardState.READY, ShardState.UNHEALTHY):
            changes.setdefault("probe_failures", 0)
        rec.status = dataclasses.replace(rec.status, state=state, **changes)  # type: ignore[arg-type]
        log.log(logging.INFO if report and not quiet else logging.DEBUG, "shard %s: %s: %s", rec.status.shard_id,
                state.value, rec.status.message)
        rec.was_ready = rec.was_ready or state is ShardState.READY
        if state in ShardState.terminal():
            statefiles.remove(rec.state_path)
            rec.state_path = None
            self._ended.append(rec.status.shard_id)
            while len(self._ended) > self._max_terminal:
                self._forget(self._ended.popleft())
        if not report:
            return rec.status
        try:
            self._on_status(rec.status)
        except Exception:
            # A broken listener must not kill the monitor that called it: the
            # engine's next exit would then go unreported.
            log.exception("on_status raised for shard %s", rec.status.shard_id)
        return rec.status

    def _forget(self, shard_id: str) -> None:
        rec = self._shards.pop(shard_id, None)
        if rec is not None and rec.plan is not None:
            # Its log goes with it: one log per attempt, kept for ever, fills the
            # disk of an agent that has been up for months.
            try:
                rec.plan.log_path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove the log of forgotten shard %s: %s", shard_id, exc)
