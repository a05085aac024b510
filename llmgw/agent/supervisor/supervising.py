"""The supervisor: launches shards, watches each with one task, stops them; never raises.

Every command is idempotent. ``start`` with a shard id it already knows, in any
state, reports that shard and launches nothing: the control plane retries, and
a retry must never become a second engine on the same GPUs. Launches and stops
run as tasks owned by the shard's record, so a caller that is cancelled (a
stream that drops mid-command) cannot leave a process half-started or a
SIGTERM without its SIGKILL; callers only wait on them.

A shard moves STARTING -> READY -> (FAILED | STOPPING -> STOPPED), or straight
to FAILED when it cannot be launched. The startup timeout is the control
plane's to enforce: killing a slow loader here would race its decision to
replace it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import aiohttp

from llmgw.agent import engines, weights
from llmgw.agent.discovery import host as host_facts
from llmgw.agent.supervisor import ending, launching, records, watching
from llmgw.core.errors import EngineError
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)
S = ShardState
#: How long a stop waits past the grace, after SIGKILL, before answering STOPPING
#: (STOPPED follows when the process exits; one stuck in the kernel takes a while).
KILL_WAIT_S = 10.0


class Registry(Protocol):
    """Where adapters come from: ``llmgw.agent.engines`` itself, or a test's own."""

    def get(self, name: str) -> engines.Adapter: ...


class Supervisor:
    """Starts, watches and stops engine processes: the agent's only use of subprocesses."""

    def __init__(self, *, run_dir: Path, host: str, on_status: Callable[[ShardStatus], None],
                 cpu_count: int | None = None, grace_s: float = 10.0, health_interval_s: float = 0.5,
                 adapters: Registry = engines, resolve: Callable[[str], str | None] = weights.resolve_source,
                 clock: Callable[[], float] = time.monotonic, max_terminal: int = 100) -> None:
        self._run_dir, self._host = run_dir, host
        self._cpu_count = cpu_count or host_facts.cpu_count()
        self._grace_s, self._interval_s = grace_s, health_interval_s
        self._adapters, self._resolve, self._clock = adapters, resolve, clock
        self._recs = records.Records(on_status, max_terminal=max_terminal)
        self._session: aiohttp.ClientSession | None = None

    def status(self, shard_id: str) -> ShardStatus | None:
        rec = self._recs.get(shard_id)
        return rec.status if rec else None

    def statuses(self) -> list[ShardStatus]:
        return [rec.status for rec in self._recs.all()]

    async def start(self, spec: ShardSpec) -> ShardStatus:
        """Launch ``spec``'s engine, or report the shard already known by its id."""
        rec = self._recs.get(spec.shard_id)
        if rec is None:
            rec = records.Shard(ShardStatus(spec.shard_id, spec.replica_id, S.STARTING, spec=spec),
                                started_at=self._clock())
            self._recs.add(rec)
            rec.starting = asyncio.create_task(self._launch(rec, spec), name=f"launch {spec.shard_id}")
        elif rec.status.spec != spec:
            log.warning("shard %s is already known; a start with a different spec was ignored "
                        "(a new attempt needs a new shard id)", spec.shard_id)
        if rec.starting is not None and not rec.starting.done():
            await asyncio.shield(rec.starting)
        return rec.status

    async def _launch(self, rec: records.Shard, spec: ShardSpec) -> ShardStatus:
        try:
            adapter = self._adapters.get(spec.engine)
            adapter.validate(spec)
            # Resolving may stat a network filesystem: never on the event loop.
            model_path = await asyncio.to_thread(self._resolve, spec.source) if spec.source else None
            plan = launching.plan(spec, adapter, host=self._host, model_path=model_path,
                                  cpu_count=self._cpu_count, run_dir=self._run_dir)
            rec.proc, rec.log_offset = await launching.spawn(plan)
        except EngineError as exc:
            return self._recs.move(rec, S.FAILED, message=str(exc))
        except Exception as exc:
            # A bug in an adapter must still end in FAILED: a record left in
            # STARTING with no process would never move again.
            log.exception("launching shard %s failed", spec.shard_id)
            return self._recs.move(rec, S.FAILED, message=f"cannot start shard {spec.shard_id}: "
                                   f"internal error {type(exc).__name__}: {exc}; see the agent's log")
        rec.plan = plan
        self._recs.move(rec, S.STARTING, endpoint=plan.endpoint, pid=rec.proc.pid,
                        message=f"launched {plan.argv[0]}; its output goes to {plan.log_path}")
        rec.monitor = asyncio.create_task(
            watching.watch(rec, rec.proc, plan, recs=self._recs, http=self._http,
                           interval_s=self._interval_s, clock=self._clock), name=f"watch {spec.shard_id}")
        return rec.status

    async def stop(self, shard_id: str, *, grace_s: float | None = None, reason: str = "") -> ShardStatus:
        """SIGTERM, then SIGKILL after the grace. An unknown or ended shard is reported as it is."""
        rec = self._recs.get(shard_id)
        if rec is None:
            return ShardStatus(shard_id, "", S.STOPPED, message=f"no shard {shard_id} on this node")
        if rec.starting is not None and not rec.starting.done():
            await asyncio.shield(rec.starting)
        if rec.status.state in S.terminal() or rec.proc is None:
            return rec.status  # ended, or its launch was cancelled by close()
        grace = self._grace_s if grace_s is None else grace_s
        if rec.stopping is None:
            rec.stopping = asyncio.create_task(self._stop(rec, grace, reason), name=f"stop {shard_id}")
        try:
            return await asyncio.wait_for(asyncio.shield(rec.stopping), grace + KILL_WAIT_S)
        except TimeoutError:
            return rec.status  # still STOPPING; STOPPED is reported when it does exit

    async def _stop(self, rec: records.Shard, grace: float, reason: str) -> ShardStatus:
        assert rec.proc is not None
        self._recs.move(rec, S.STOPPING, message=reason or "stop requested")
        code, killed = await ending.terminate(rec.proc, grace_s=grace)
        said = reason or "stopped on request"
        if killed:
            log.warning("shard %s ignored SIGTERM for %g s and was killed", rec.status.shard_id, grace)
            said += f"; it did not exit within {grace:g} s of SIGTERM and was killed"
        return self._recs.move(rec, S.STOPPED, message=said, exit_code=code)

    async def stop_all(self, *, reason: str) -> None:
        """Stop every shard that may still have a process, all at once."""
        ids = [r.status.shard_id for r in self._recs.all() if r.status.state in S.live()]
        await asyncio.gather(*(self.stop(sid, reason=reason) for sid in ids))

    async def close(self) -> None:
        """Stop watching (the engines keep running); stops already under way are finished."""
        recs = self._recs.all()
        tasks = [t for r in recs for t in r.tasks() if t is not r.stopping]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stops = [r.stopping for r in recs if r.stopping is not None and not r.stopping.done()]
        if stops:
            await asyncio.wait(stops, timeout=self._grace_s + KILL_WAIT_S)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # trust_env stays off: an HTTP_PROXY in the agent's environment
            # would send probes of loopback engines to the proxy.
            self._session = aiohttp.ClientSession()
        return self._session
