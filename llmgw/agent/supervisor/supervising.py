"""The supervisor: launches shards, watches each with one task, stops them; never raises.

Every command is idempotent. ``start`` with a shard id it already knows, in any
state, reports that shard and launches nothing: the control plane retries, and
a retry must never become a second engine on the same GPUs. Launches and stops
run as tasks owned by the shard's record, so a caller that is cancelled (a
stream that drops mid-command) cannot leave a process half-started or a
SIGTERM without its SIGKILL; callers only wait on them.

A shard moves STARTING -> READY -> (FAILED | STOPPING -> STOPPED), or straight
to FAILED when it cannot be launched; a drain puts DRAINING -> DRAINED before
the stop. One whose source is remote is FETCHING first (``fetching``), with the
fetcher's progress at most once a second, and FAILED with the fetcher's
sentence when its weights cannot be had; a stop or a drain of a FETCHING shard
ends its wait at once (STOPPED, nothing launched), and the download goes on for
any other shard that shares it. A READY engine that stops answering its health
probe goes UNHEALTHY, and READY again if it answers (``liveness``); an
UNHEALTHY one is stopped or drained like a ready one. The startup timeout is the control plane's to
enforce: killing a slow loader here would race its decision to replace it.
FAILED always means the process is gone.

Each shard's process, launched or adopted, is one ``process.EngineProcess``:
the watcher, the drain and the stop ask it, never a pid or a session of their own.

Before anything is launched the adapter's ``validate`` is asked with this
node's facts and what the resolved weights say about the model (their
metadata as discovery read it: headers and config.json, never the tensors),
so that a tensor-parallel size that does not divide the heads, or a context
past the model's, is FAILED with the reason now instead of minutes into
loading. A worker rank that serves no HTTP (``Launch.serves_http`` False) is
READY once it has stayed alive ``worker_settle_s`` and is then watched for its
exit alone. Each shard's work dir goes once its process is gone.

Engines outlive the agent: ``close`` leaves them running, each shard's state
file (``statefiles``) describes it, and ``recover``, called by the next agent
before it registers, adopts what still runs (``adopting``, this class's part that
does both; ``recovering`` decides, ``orphans`` watches and ends what we did not start).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from llmgw.agent import engines, enginetls, weights
from llmgw.agent.discovery import files as weight_files
from llmgw.agent.discovery import host as host_facts
from llmgw.agent.fetch import records as fetch_records
from llmgw.agent.supervisor import (
    adopting,
    draining,
    fetching,
    identity,
    launching,
    liveness,
    lorafiles,
    loras,
    process,
    records,
    sleeping,
    watching,
)
from llmgw.core import enginecheck, inventory
from llmgw.core.errors import EngineError, FetchError, SpecError
from llmgw.core.shards import FetchProgress, ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)
S = ShardState
#: How long a stop waits past the grace, after SIGKILL, before answering STOPPING
#: (STOPPED follows when the process exits; one stuck in the kernel takes a while).
KILL_WAIT_S = 10.0


class Registry(Protocol):
    """Where adapters come from: ``llmgw.agent.engines`` itself, or a test's own."""

    def get(self, name: str, version: str = "") -> engines.Adapter: ...


class Supervisor(adopting.Adopting):
    """Starts, watches and stops engine processes: the agent's only use of subprocesses."""

    def __init__(self, *, run_dir: Path, host: str, on_status: Callable[[ShardStatus], None],
                 cpu_count: int | None = None, grace_s: float = 10.0, health_interval_s: float = 0.5,
                 adapters: Registry = engines, resolve: Callable[[str], str | None] = weights.resolve_source,
                 resolve_adapter: Callable[[str], str | None] = weights.resolve_adapter,
                 clock: Callable[[], float] = time.monotonic, max_terminal: int = 100,
                 adopt_timeout_s: float = 60.0, live: liveness.Liveness | None = None,
                 node: Callable[[], enginecheck.NodeFacts | None] = lambda: None,
                 model_meta: Callable[[str], inventory.WeightFile | None] = weight_files.weight_at,
                 worker_settle_s: float = watching.WORKER_SETTLE_S,
                 fetcher: fetching.Fetcher | None = None,
                 on_weights_changed: Callable[[], None] = lambda: None,
                 users: identity.Users | None = None, engine_tls: enginetls.EngineTls | None = None,
                 on_plan: Callable[[ShardSpec, launching.Plan], launching.Plan] = lambda _s, p: p) -> None:
        # Absolute, and resolved once: it is the marker in every engine's
        # environment, and the next agent must spell it the same way.
        self._run_dir, self._host = Path(run_dir).resolve(), host
        self._cpu_count = cpu_count or host_facts.cpu_count()
        self._grace_s, self._interval_s = grace_s, health_interval_s
        self._adapters, self._resolve, self._clock = adapters, resolve, clock
        self._resolve_adapter = resolve_adapter  # a LoRA adapter's directory, within the same source roots
        self._timing = watching.Timing(interval_s=health_interval_s, adopt_timeout_s=adopt_timeout_s,
                                       live=live or liveness.Liveness(), clock=clock,
                                       worker_settle_s=worker_settle_s)
        # What discovery found on this node (None until it has looked): a shard
        # given no GPU on a GPU node is hidden from them, one naming a GPU the
        # node lacks is refused before it loads for minutes, and the adapters
        # derive the collectives' interface and adapters from it.
        self._node = node
        # The weights' metadata at a resolved path (blocking: run in a thread).
        self._model_meta = model_meta
        self._recs = records.Records(on_status, max_terminal=max_terminal)
        self._session: aiohttp.ClientSession | None = None
        # The weights cache's owner (None: this agent fetches nothing, and a remote source fails).
        self._fetcher = fetcher
        # Told when the cache gained or lost weights, so the inventory says so now, not at its next rescan.
        self._on_weights_changed = on_weights_changed
        # Who each engine runs as (the agent passes its engine_user policy): by default engine_user auto,
        # so no engine runs as root however the supervisor was made.
        self._users = users or identity.Users(identity.resolve(identity.AUTO))
        # TLS on engines (engine_tls): None or off, every engine is plain HTTP. on_plan: the KV events link's flag.
        self._engine_tls, self._on_plan = engine_tls, on_plan

    def status(self, shard_id: str) -> ShardStatus | None:
        rec = self._recs.get(shard_id)
        return rec.status if rec else None

    def statuses(self) -> list[ShardStatus]:
        return [rec.status for rec in self._recs.all()]

    def pids(self) -> dict[str, int]:
        """The engine pid of every shard whose process may still run, for load sampling."""
        return {r.status.shard_id: r.status.pid for r in self._recs.all()
                if r.status.state in S.live() and r.status.pid > 0}

    async def start(self, spec: ShardSpec) -> ShardStatus:
        """Launch ``spec``'s engine, or report the shard already known by its id."""
        rec = self._recs.get(spec.shard_id)
        if rec is None:
            remote = fetching.is_remote(spec.source) or lorafiles.remote(spec)
            first = ShardStatus(spec.shard_id, spec.replica_id, S.FETCHING if remote else S.STARTING,
                                spec=fetching.stored(spec), fetch=FetchProgress() if remote else None,
                                message=f"fetching {spec.source}" if remote else "")
            rec = records.Shard(first, started_at=self._clock())
            self._recs.add(rec)
            if remote:
                self._recs.move(rec, S.FETCHING)  # on_status hears of it before the download's first byte
            rec.starting = asyncio.create_task(self._launch(rec, spec), name=f"launch {spec.shard_id}")
            self._keep_adapters(rec, spec)
        elif loras.only_adapters_differ(rec.status.spec, fetching.stored(spec)):
            # spec.adapters changed, nothing else: loaded and unloaded in the running engine, never a restart.
            self._recs.move(rec, rec.status.state, spec=fetching.stored(spec))
            self._keep_adapters(rec, spec)
        elif rec.status.spec != fetching.stored(spec):
            log.warning("shard %s is already known; a start with a different spec was ignored "
                        "(a new attempt needs a new shard id)", spec.shard_id)
        if rec.starting is not None and not rec.starting.done() and rec.status.state is not S.FETCHING:
            await asyncio.shield(rec.starting)
        return rec.status

    def _keep_adapters(self, rec: records.Shard, spec: ShardSpec) -> None:
        """Starts (or wakes) the task that makes the engine hold ``spec.adapters`` (``loras``)."""
        if rec.loras is not None:
            rec.loras.token = spec.hub_token or rec.loras.token
            rec.loras.wanted.set()
            return
        if not spec.adapters or rec.lora_task is not None:
            return
        if lorafiles.at_start(spec):  # llama.cpp: files on its command line, checked once it is READY
            keep = lorafiles.keep(rec, self._recs, http=self._http, interval_s=self._interval_s)
            rec.lora_task = asyncio.create_task(keep, name=f"adapters {spec.shard_id}")
            return
        fetch = functools.partial(lorafiles.fetch_shown, rec, self._recs, self._ensure, self._clock)
        rec.loras = loras.Keeper(rec, self._recs, http=self._http, fetch=fetch if self._fetcher else None,
                                     token=spec.hub_token, interval_s=self._interval_s,
                                     resolve=self._resolve_adapter)
        rec.lora_task = asyncio.create_task(rec.loras.keep(), name=f"adapters {spec.shard_id}")

    async def _ensure(self, req: fetch_records.Request,
                      on_progress: Callable[[fetch_records.Progress], None] | None = None) -> str:
        assert self._fetcher is not None
        path = await self._fetcher.ensure(req, on_progress=on_progress)
        self._on_weights_changed()
        return path

    async def _fetch(self, rec: records.Shard, spec: ShardSpec) -> str | None:
        """The local path of ``spec``'s remote weights once fetched (None: its source is local).

        FetchError or SpecError when they cannot be had. The token goes to the
        fetcher alone; the progress goes up through ``Records.move``.
        """
        req = fetching.request_of(spec)
        if req is None:
            return None
        if self._fetcher is None:
            raise FetchError(f"source {spec.source} is remote and this agent has no weights cache to fetch it into; "
                             "start the agent with its default weights_cache, or use a file on the node")
        throttle = fetching.Throttle(self._clock)

        def on_progress(p: fetch_records.Progress) -> None:
            got = fetching.progress_of(p)
            if rec.status.state is S.FETCHING and throttle.due(got):
                self._recs.move(rec, S.FETCHING, fetch=got, message=fetching.describe(spec.source, got), quiet=True)

        path = await self._fetcher.ensure(req, on_progress=on_progress)
        self._on_weights_changed()
        # At once, with no await in between: from here a stop waits for the
        # launch instead of cancelling it, so no engine is spawned unwatched.
        self._recs.move(rec, S.STARTING, fetch=None, message=f"fetched {spec.source} to {path}; launching")
        return path

    async def _launch(self, rec: records.Shard, spec: ShardSpec) -> ShardStatus:
        plan: launching.Plan | None = None
        try:
            lora_paths = await lorafiles.paths(rec, self._recs, spec, fetch=self._ensure if self._fetcher else None,
                                               resolve=self._resolve, resolve_dir=self._resolve_adapter,
                                               clock=self._clock) \
                if lorafiles.at_start(spec) else ()
            fetched = await self._fetch(rec, spec)
        except (FetchError, SpecError) as exc:
            return self._recs.move(rec, S.FAILED, fetch=None, message=str(exc))
        except Exception as exc:
            log.exception("fetching the weights of shard %s failed", spec.shard_id)
            return self._recs.move(rec, S.FAILED, fetch=None, message=f"cannot fetch the weights of shard "
                                   f"{spec.shard_id}: internal error {type(exc).__name__}: {exc}; see the agent's log")
        try:
            adapter = self._adapters.get(spec.engine, spec.engine_version)
            node = self._node()
            # Resolving may stat a network filesystem, and the metadata is a
            # header read (cached by discovery's scans): never on the event loop.
            if fetched is not None:
                model_path: str | None = await asyncio.to_thread(weights.resolve_fetched, spec.source, fetched)
            else:
                model_path = await asyncio.to_thread(self._resolve, spec.source) if spec.source else None
            model = await asyncio.to_thread(self._model_meta, model_path) if model_path else None
            adapter.validate(spec, node=node, model=model)
            # Before a user is taken: a start refused for want of a certificate holds nothing.
            tls = await self._engine_tls.material() if enginetls.wanted_by(self._engine_tls, self._host) else None
            user = self._users.take(spec.shard_id, live={r.status.shard_id for r in self._recs.all()
                                                         if r.status.state in S.live()})
            plan = self._on_plan(spec, launching.plan(spec, adapter, host=self._host, model_path=model_path,
                                                      cpu_count=self._cpu_count, run_dir=self._run_dir, node=node,
                                                      user=user, tls=tls, lora_paths=lora_paths))
            # Asked before the spawn: an adapter that raised here after it would
            # leave a running engine that no watcher follows.
            in_flight = draining.probe_of(adapter)
            child, log_offset = await launching.spawn(plan)
        except EngineError as exc:
            return self._failed_to_launch(rec, plan, str(exc))
        except Exception as exc:
            # A bug in an adapter must still end in FAILED: a record left in
            # STARTING with no process would never move again.
            log.exception("launching shard %s failed", spec.shard_id)
            return self._failed_to_launch(rec, plan, f"cannot start shard {spec.shard_id}: internal error "
                                          f"{type(exc).__name__}: {exc}; see the agent's log")
        rec.plan = plan
        rec.engine = process.EngineProcess(spec, plan, http=self._http, log_offset=log_offset, child=child,
                                           in_flight_probe=in_flight, poll_s=self._interval_s)
        # Right after the spawn, with no await in between: the watcher that
        # could report an early exit (and remove the file) starts below.
        self._save(rec, spec, plan, child.pid)
        self._recs.move(rec, S.STARTING, endpoint=plan.endpoint, pid=child.pid,
                        message=f"launched {plan.argv[0]}; its output goes to {plan.log_path}")
        rec.monitor = asyncio.create_task(self._watch(rec), name=f"watch {spec.shard_id}")
        return rec.status

    def _failed_to_launch(self, rec: records.Shard, plan: launching.Plan | None, message: str) -> ShardStatus:
        if plan is not None:
            # Made by the plan, and empty: no process ever ran in it.
            launching.remove_work_dir(plan.work_dir)
        return self._recs.move(rec, S.FAILED, message=message)

    def _watch(self, rec: records.Shard) -> Coroutine[Any, Any, None]:
        return watching.watch(rec, recs=self._recs, timing=self._timing, give_up=self._give_up)

    async def stop(self, shard_id: str, *, grace_s: float | None = None, reason: str = "") -> ShardStatus:
        """SIGTERM, then SIGKILL after the grace. An unknown or ended shard is reported as it is."""
        rec = self._recs.get(shard_id)
        if rec is None:
            return ShardStatus(shard_id, "", S.STOPPED, message=f"no shard {shard_id} on this node")
        if rec.status.state is S.FETCHING:
            return await self._end_fetch(rec, reason or "stop requested")
        if rec.starting is not None and not rec.starting.done():
            await asyncio.shield(rec.starting)
        if rec.status.state in S.terminal() or not rec.has_process():
            return rec.status  # ended, or its launch was cancelled by close()
        grace = self._grace_s if grace_s is None else grace_s
        if rec.stopping is None:
            rec.stopping = asyncio.create_task(self._stop(rec, grace, reason), name=f"stop {shard_id}")
        try:
            return await asyncio.wait_for(asyncio.shield(rec.stopping), grace + KILL_WAIT_S)
        except TimeoutError:
            return rec.status  # still STOPPING; STOPPED is reported when it does exit

    async def _stop(self, rec: records.Shard, grace: float, reason: str, *,
                    failure: str | None = None) -> ShardStatus:
        """End the process; STOPPED, or FAILED with ``failure`` when it is being given up on."""
        if failure is None:
            self._recs.move(rec, S.STOPPING, message=reason or "stop requested")
        assert rec.engine is not None
        # SIGKILL after the grace is what ends an UNHEALTHY engine that was
        # frozen (SIGSTOP, a tracer): its SIGTERM stays pending for ever.
        killed = await rec.engine.terminate(grace_s=grace)
        code = rec.engine.exit_code
        said = failure or reason or "stopped on request"
        if killed:
            log.warning("shard %s ignored SIGTERM for %g s and was killed", rec.status.shard_id, grace)
            said += f"; it did not exit within {grace:g} s of SIGTERM and was killed"
        ended = self._recs.move(rec, S.FAILED if failure else S.STOPPED, message=said, exit_code=code)
        await rec.engine.remove_work_dir()
        return ended

    async def drain(self, shard_id: str, *, timeout_s: float) -> ShardStatus:
        """DRAINING, then DRAINED once the engine holds no request or ``timeout_s`` has passed.

        Returns when the drain ends (a stop or an exit ends it too). Idempotent:
        a shard already DRAINING or DRAINED, stopping or ended is reported as it
        is, and an unknown one as STOPPED. A drained engine keeps running until
        it is stopped.
        """
        rec = self._recs.get(shard_id)
        if rec is None:
            return ShardStatus(shard_id, "", S.STOPPED, message=f"no shard {shard_id} on this node")
        if rec.status.state is S.FETCHING:
            # Nothing launched, so nothing in flight: waiting for the fetch to end would only
            # start an engine that is about to be stopped.
            return await self._end_fetch(rec, "drained while fetching its weights")
        if rec.starting is not None and not rec.starting.done():
            await asyncio.shield(rec.starting)
        state = rec.status.state
        if state is S.STARTING and (rec.engine is None or not rec.engine.adopted):
            # Still loading: it has never been in the router's table, so nothing is in flight.
            return self._recs.move(rec, S.DRAINED, message="drained before it was ready: it had served nothing")
        if state not in (S.READY, S.STARTING, S.UNHEALTHY) or rec.draining is not None or not rec.has_process():
            return rec.status
        assert rec.engine is not None
        if not rec.engine.serves_http:
            # Nothing to ask, and nothing to wait for: requests reach the replica's leader.
            return self._recs.move(rec, S.DRAINED, message="drained at once: a worker rank holds no requests of "
                                   "its own (its leader's drain waits for them)")
        # An adopted engine still being checked may be serving: the router kept
        # sending to it while the agent restarted. It is drained like a ready one.
        # So is an UNHEALTHY one: its drain ends at the timeout at the latest.
        was = f"; it was {rec.status.message}" if state is S.UNHEALTHY else ""
        self._recs.move(rec, S.DRAINING, message=f"draining: waiting up to {timeout_s:g} s for the requests "
                        f"in flight to finish{was}")
        rec.draining = asyncio.create_task(
            draining.drain(rec, recs=self._recs, timeout_s=timeout_s, clock=self._clock), name=f"drain {shard_id}")
        return await asyncio.shield(rec.draining)

    async def sleep(self, shard_id: str, level: int) -> ShardStatus:
        """Put a READY shard's engine to sleep (level 1, 2) or wake it (0); ``sleeping.sleep``."""
        rec = self._recs.get(shard_id)
        if rec is None:
            return ShardStatus(shard_id, "", S.STOPPED, message=f"no shard {shard_id} on this node")
        return await sleeping.sleep(rec, recs=self._recs, level=level)

    async def _end_fetch(self, rec: records.Shard, reason: str) -> ShardStatus:
        """A FETCHING shard's wait ended: STOPPED, nothing launched; the download goes on for any other shard."""
        task = rec.starting
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if rec.status.state is not S.FETCHING:
            return rec.status  # the fetch failed or ended as it was being cancelled: what it said stands
        return self._recs.move(rec, S.STOPPED, fetch=None,
                               message=f"{reason}; stopped while fetching its weights (nothing was launched)")

    def held(self) -> list[object]:
        """What the weights cache holds (the fetcher's ``Held`` records); nothing without a fetcher."""
        return list(self._fetcher.held()) if self._fetcher is not None else []

    async def remove_weights(self, cache_name: str) -> None:
        """Remove weights llmgw fetched; FetchError with the refusal (or the reason it cannot) otherwise."""
        if self._fetcher is None:
            raise FetchError(f"cannot remove {cache_name!r}: this agent has no weights cache")
        # Deleting a model's files can take seconds on a slow disk: off the event loop.
        await asyncio.to_thread(self._fetcher.remove, cache_name)
        self._on_weights_changed()

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
            # https engines: the cluster CA and this node's engine certificate, checked at each handshake.
            ssl = enginetls.client_ssl(self._engine_tls)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl))
        return self._session
