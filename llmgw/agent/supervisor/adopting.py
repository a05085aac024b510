"""Engines outlive the agent: what ``Supervisor`` writes so the next agent can take them back, and the taking.

``_save`` writes each launched shard's state file (``statefiles``) right after its spawn. ``recover``,
called by the next agent before it registers, reads them with /proc (``recovering`` decides what is
adopted, forgotten or killed) and adopts each engine that still runs as one of its own shards, watched
like a launched one; ``_give_up`` stops an adopted engine that cannot be used (FAILED once it is gone).

``Adopting`` is a part of ``Supervisor`` (its only subclass), apart for size: the attributes below are
``Supervisor``'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import psutil

from llmgw.agent import engines
from llmgw.agent.supervisor import (
    draining,
    fetching,
    identity,
    launching,
    orphans,
    process,
    records,
    recovering,
    statefiles,
)
from llmgw.core.errors import EngineError
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

if TYPE_CHECKING:
    from llmgw.agent.supervisor.supervising import Registry

log = logging.getLogger(__name__)
S = ShardState


class Adopting:
    """The state files and ``recover``: the part of ``Supervisor`` that lets engines outlive the agent."""

    # Set by ``Supervisor.__init__``.
    _run_dir: Path
    _host: str
    _grace_s: float
    _interval_s: float
    _adapters: Registry
    _clock: Callable[[], float]
    _recs: records.Records
    _users: identity.Users
    _on_plan: Callable[[ShardSpec, launching.Plan], launching.Plan]
    # ``Supervisor``'s own methods.
    _http: Callable[[], aiohttp.ClientSession]
    _watch: Callable[[records.Shard], Coroutine[Any, Any, None]]
    _keep_adapters: Callable[[records.Shard, ShardSpec], None]
    _stop: Callable[..., Coroutine[Any, Any, ShardStatus]]

    def _save(self, rec: records.Shard, spec: ShardSpec, plan: launching.Plan, pid: int) -> None:
        """Write the shard's state file; a failure is logged, and the engine runs on undescribed."""
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            return  # already gone, and the watcher is about to say so
        saved = statefiles.Saved(spec=fetching.stored(spec), pid=pid, create_time=create_time, port=plan.port,
                                 endpoint=plan.endpoint, host=self._host, log_path=plan.log_path,
                                 log_offset=rec.engine.log_offset if rec.engine else 0, argv=tuple(plan.argv),
                                 serves_http=plan.serves_http, uid=plan.user.uid if plan.user else None,
                                 gid=plan.user.gid if plan.user else None)
        try:
            # A small local file: written on the event loop, as the log tail is read.
            rec.state_path = statefiles.write(self._run_dir, saved)
        except OSError as exc:
            # Not a reason to fail a healthy engine; the cost is that an agent
            # restarted before this shard ends cannot adopt it, and kills it.
            log.warning("cannot write the state file of shard %s: %s; a restarted agent will not adopt it",
                        spec.shard_id, exc.strerror or exc)

    async def recover(self) -> list[ShardStatus]:
        """Take back the engines a previous agent left running; call once, before registering.

        Adopted shards are returned STARTING with ``adopted=True`` and move to
        READY (or FAILED, the engine stopped) in the background: a slow probe
        must not delay registration. Dead shards' state files are removed and
        unidentifiable engines killed, as ``recovering`` explains.
        """
        keep = {r.status.pid for r in self._recs.all() if r.status.pid}
        known = {r.status.shard_id for r in self._recs.all()}
        # /proc and the run dir: blocking reads, off the event loop.
        files, found = await asyncio.to_thread(recovering.look, self._run_dir, ours=self._may_be_engine)
        decisions = recovering.decide(files, found, run_dir=str(self._run_dir), keep=keep, known=known)
        adopted = []
        for d in decisions:
            if isinstance(d, recovering.Forget):
                log.info("removing state file %s: %s", d.path, d.reason)
                statefiles.remove(d.path)
            elif isinstance(d, recovering.Kill):
                if orphans.kill(d.seen):
                    log.warning("killed pid %d (and the group it leads): it cannot be described to the "
                                "control plane, whose placement would hand out its resources again: %s",
                                d.seen.pid, d.reason)
            else:
                adopted.append(self._adopt(d))
        # The work dirs of the engines found dead or killed: theirs alone, and
        # llmgw made them (many files, maybe: off the loop).
        ended = recovering.ended_work_dirs(decisions, run_dir=self._run_dir)
        if ended:
            await asyncio.to_thread(lambda: [launching.remove_work_dir(path) for path in ended])
        return adopted

    def _adopt(self, d: recovering.Adopt) -> ShardStatus:
        saved = d.saved
        spec = saved.spec
        message = f"adopted from a previous agent (pid {saved.pid})"
        if d.note:
            log.warning("shard %s: %s", spec.shard_id, d.note)
        adapter: engines.Adapter | None = None
        unknown = ""
        try:
            adapter = self._adapters.get(spec.engine, spec.engine_version)
        except EngineError as exc:
            unknown = str(exc)
        plan = launching.Plan(argv=list(saved.argv), env={}, endpoint=saved.endpoint,
                              health_path=adapter.health_path if adapter else "", log_path=saved.log_path,
                              port=saved.port, serves_http=saved.serves_http,
                              work_dir=launching.work_dir_of(self._run_dir, spec.shard_id),
                              user=self._users.keep(spec.shard_id, saved.uid, saved.gid))
        engine = process.EngineProcess(spec, plan, http=self._http, log_offset=saved.log_offset,
                                       orphan=orphans.Orphan(d.seen), poll_s=self._interval_s,
                                       in_flight_probe=draining.probe_of(adapter) if adapter else None)
        rec = records.Shard(ShardStatus(spec.shard_id, spec.replica_id, S.STARTING, message=message,
                                        endpoint=saved.endpoint, pid=saved.pid, spec=spec, adopted=True),
                            started_at=self._clock(), engine=engine, plan=plan if adapter else None,
                            state_path=statefiles.path_of(self._run_dir, spec.shard_id))
        self._recs.add(rec)
        self._recs.move(rec, S.STARTING)  # on_status hears of it, as of a launch
        if adapter is not None:
            self._on_plan(spec, plan)  # the KV events link follows the ports its argv names (``agent.kvlink``)
        if adapter is None:
            self._give_up(rec, f"cannot judge the adopted engine: {unknown}; it was stopped")
            return rec.status
        rec.monitor = asyncio.create_task(self._watch(rec), name=f"watch adopted {spec.shard_id}")
        # Its adapters as the engine holds them, read from the engine once it is judged ready (``loras``).
        self._keep_adapters(rec, spec)
        return rec.status

    def _may_be_engine(self, uid: int) -> bool:
        return self._users.policy.may_be_engine(uid, os.getuid())

    def _give_up(self, rec: records.Shard, failure: str) -> None:
        """Stop an adopted engine that cannot be used; FAILED follows once it is gone."""
        if rec.stopping is None:
            rec.stopping = asyncio.create_task(self._stop(rec, self._grace_s, "", failure=failure),
                                               name=f"give up {rec.status.shard_id}")
