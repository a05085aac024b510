"""The control plane's front: it takes over, steps down, and runs the loop whose passes step each manager
(``control.loop``) in order; everything else it hands to the manager whose job it is.

A pass reads, decides, writes the targets, then sends; the pure part runs off the event loop in the server
(``control.loop``). The loop is woken by anything that changes the picture (an apply, a registration, a
shard status) and otherwise looks again every second, because time passing is a change too (a startup
timeout, a backoff ending).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from llmgw.api import routing
from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control import kvrelay, loadreports, remotemeta, tokenizerfiles, upgrades
from llmgw.control.engineaccess import EngineAccess
from llmgw.control.history import MetricsHistory
from llmgw.control.loop.autoscaling import Autoscaling, in_force
from llmgw.control.loop.context import InContext, LoopContext
from llmgw.control.loop.executor import Executor, write_targets
from llmgw.control.loop.links import AgentLink, Links, LogsError, NodeNotConnected
from llmgw.control.loop.nodes import Nodes
from llmgw.control.loop.plan import Loaded, Plan, load, read_targets
from llmgw.control.loop.planner import Planner
from llmgw.control.loop.recorder import Recorder
from llmgw.control.loop.sleeper import Sleeper
from llmgw.control.loop.table import TablePublisher
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.state import NodeView
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Fenced, Store, StoredAutoscale, StoredNode
from llmgw.core.inventory import Heartbeat
from llmgw.core.provision import Provision
from llmgw.core.shards import ShardStatus

# What callers of the control plane import from here, made by the loop's managers.
__all__ = ["AgentLink", "Cluster", "LogsError", "NodeNotConnected", "in_force"]
log = logging.getLogger(__name__)


class Cluster:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time,
                 cfg: decide.Config = decide.Config(), heartbeat_timeout_s: float = 20.0,
                 interval_s: float = 1.0, ejections: Callable[[], dict[str, str]] | None = None,
                 db: StoreThread | None = None, remote_meta: remotemeta.Reader | None = None,
                 standby: bool = False, signals: loadreports.RouterSignals | None = None,
                 engine_ca: str = "") -> None:
        """``engine_ca``: the cluster CA's certificate (PEM), published in the routers' table: they verify
        engines serving TLS with it."""
        self.store, self.clock, self.cfg, self.db, self.interval_s = store, clock, cfg, db, interval_s
        #: Without election (unit tests, ``Cluster(store)``) it leads from the start.
        self.ctx = LoopContext(store, db, clock, cfg, self.kick, leading=not standby)
        #: Reads remote sources' metadata before their replicas are placed (None: placed without it).
        self.remote_meta = remote_meta
        if remote_meta is not None:
            remote_meta.on_read = self.kick  # an answer lets the replicas waiting for it be placed
        #: kv_aware models' tokenizer files for routers, read through the same hub or mirror (issue 31).
        self.tokenizer_files = tokenizerfiles.TokenizerFiles(remote_meta) if remote_meta is not None else None
        #: The replicas routers have ejected now, with their sentence (their reports: ``RouterEvents.current``):
        #: evidence for an Unhealthy replica's grace, never a reason alone (``reconcile.liveness``).
        self.ejections = ejections or dict
        self.recorder = Recorder(self.ctx)
        self.node_manager = Nodes(self.ctx, self.recorder)
        self.links = Links(self.ctx, self.recorder, heartbeat_timeout_s=heartbeat_timeout_s,
                           known=lambda node_id: node_id in self.node_manager.views, silent=self.node_disconnected)
        self.autoscaling = Autoscaling(signals if signals is not None else loadreports.RouterSignals(clock=clock),
                                       kick=self.kick)
        #: What routers report of each model's load (issue 17): the autoscaler's input.
        self.signals = self.autoscaling.signals
        #: The UI's charts (issue 30): what routers and agents report, kept a day in memory.
        self.history = MetricsHistory()
        self.signals.on_report = self.history.load_report
        self.executor = Executor(self.ctx, self.links, views=lambda: self.node_manager.views,
                                 provisioning_inputs=self._engine_inputs)
        self.planner = Planner(self.ctx, autoscaling=self.autoscaling, recorder=self.recorder, executor=self.executor,
                               ejections=self.ejections, remote_meta=remote_meta,
                               provisioning_inputs=self._engine_inputs)
        self.table = TablePublisher(self.ctx, engine_ca=engine_ca, held=self._adapters_held)
        #: Issue 33: how routers reach each node's engines (direct or its tunnel), read by the table and the API.
        self.engine_access = EngineAccess(on_change=self.kick)
        self.table.tunnels = self.engine_access.routes
        #: The replicas' KV block sets from their agents, relayed to routers (routing kv_aware), in memory.
        self.kv = kvrelay.KvRelay()
        #: The tunnel port (0: none), told to standalone routers with each table (``api.tunnel.PORT_HEADER``).
        self.tunnel_port = 0
        #: spec.idle (issue 31): ready replicas put to sleep when idle, woken when a request is held for them.
        self.sleeper = Sleeper(self.ctx, self.links, self.signals, lambda: self.node_manager.views, self.record)
        #: Operators' engine wants and the cluster's engine settings (``control.engines`` rebinds them on a change).
        self.engine_wants: tuple[provisioning.ScopedWant, ...] = ()
        self.engine_settings = provisioning.EngineSettings.from_map({})
        #: Agents' upgrades under way and their last outcome (``llmgw node upgrade``), the leader's, in memory.
        self.upgrades = upgrades.Upgrades(clock=clock, record=self.record)
        self._wake = asyncio.Event()
        if not standby:
            self._take(load(store))

    # -- what the managers hold, as callers read it -------------------------------------------
    @property
    def nodes(self) -> dict[str, NodeView]:
        return self.node_manager.views

    #: Whether this control plane leads, the term it leads at, and the lease's callbacks (set by ``serve``):
    #: the loop context's, which every manager reads (``control.loop.context``).
    leading: InContext[bool] = InContext()
    term: InContext[int] = InContext()
    may_act: InContext[Callable[[], bool]] = InContext()
    on_fenced: InContext[Callable[[], None]] = InContext()
    hint: InContext[Callable[[], tuple[str, tuple[str, ...]]]] = InContext()

    def _engine_inputs(self) -> tuple[tuple[provisioning.ScopedWant, ...], provisioning.EngineSettings]:
        return self.engine_wants, self.engine_settings

    # -- leading and standing by (issue 15) -----------------------------------------------------
    def _take(self, loaded: Loaded) -> None:
        """Starts from the store's picture, as at a start: every node known but not heard from yet."""
        self.node_manager.take(loaded)
        self.recorder.take(loaded)
        self.autoscaling.take(loaded)
        self.executor.take()
        self.links.provisioned = {}
        self.engine_wants = loaded.wants
        self.engine_settings = provisioning.EngineSettings.from_map(loaded.settings)
        self.sleeper.take(loaded.settings)

    async def take_over(self, term: int) -> None:
        """Starts leading at ``term``: reads the store's picture afresh (it moved on while this one stood by)."""
        self._take(await self.ctx.call(load, self.store))
        self.ctx.term, self.ctx.leading = term, True
        self.recorder.drop_unwritten()
        log.info("leading at term %d: %d nodes known, each has %.0fs to register before its replicas are "
                 "replaced", term, len(self.nodes), self.cfg.node_grace_s)
        self.record(ev.Event(self.clock(), ev.NORMAL, "LeaderElected", "controlplane/leader",
                             f"this control plane leads at term {term}; {len(self.nodes)} nodes have "
                             f"{self.cfg.node_grace_s:.0f}s to register"))
        self.kick()

    def step_down(self, reason: str) -> None:
        """Stops leading at once: every agent stream is closed (each agent redials and is sent to the
        leader), nothing more is written or sent, and the in-memory picture is dropped."""
        self.ctx.leading = False
        self.recorder.drop_unwritten()
        self.links.close_all(f"this control plane no longer leads ({reason})")
        self.node_manager.views = {}
        self.upgrades.clear()
        self.kick()

    def _adapters_held(self) -> dict[str, tuple[str, ...]]:
        """The LoRA adapters each replica's engine holds, by replica id, as agents last reported."""
        return {st.replica_id: st.adapters for view in self.node_manager.views.values()
                for st in view.shards.values() if st.adapters}

    # -- what agents report ----------------------------------------------------------------------
    def node_registered(self, node: StoredNode, shards: list[ShardStatus], link: AgentLink) -> None:
        self.links.register(node.id, link)
        self.node_manager.registered(node, shards)
        self.upgrades.registered(node.id, node.agent_version)
        self.kick()

    def node_heartbeat(self, node_id: str, hb: Heartbeat) -> None:
        view = self.node_manager.views.get(node_id)
        if view is None or not self.links.beat(node_id):
            return
        self.history.heartbeat(node_id, hb, self.clock())
        if self.node_manager.heartbeat(view, hb):
            self.kick()  # an install Ready (or Failed) changes what placement can do, and says so

    def shard_reported(self, node_id: str, status: ShardStatus) -> None:
        if self.node_manager.shard_reported(node_id, status):
            self.kick()

    def node_leaving(self, node_id: str, reason: str) -> None:
        """The node's agent is stopping (its Goodbye): nothing is placed there until it registers again."""
        if self.node_manager.leaving(node_id, reason):
            self.kick()

    def node_disconnected(self, node_id: str, link: AgentLink) -> None:
        # Not its stream: an older stream ending after a newer one registered (or closed by a step-down).
        if not self.links.drop(node_id, link) or not self.leading:
            return
        self.node_manager.disconnected(node_id)
        self.kick()

    # -- the loop ----------------------------------------------------------------------------------
    def kick(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            # Cleared before the pass reads anything, so a kick during the pass (an apply
            # while it was in its thread) gets another pass at once instead of the next tick.
            self._wake.clear()
            again = await self._lead_pass() if self.leading else False
            if self.leading:  # agents' upgrades: the health gate and the deadlines, polled or not
                self.upgrades.step(lambda n: upgrades.not_ready(self.nodes.get(n), self.connected(n)))
                self._sample_history()
            await self.table.update()
            self.kv.table_changed(self.table.table)  # a replica gone from the table: its KV set with it
            self.links.announce_peers()
            # Give the event loop at least as long as the pass took before the next one:
            # passes kicked back to back by a thousand re-registering agents held the
            # loop so the registrations themselves crawled (~18 a second, seen with the
            # fleet simulator), and the nodes' grace ran out before they had reported.
            await asyncio.sleep(min(1.0, time.perf_counter() - started))
            if again:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)

    async def _lead_pass(self) -> bool:
        """``reconcile_pass``, its failures told and survived: the next pass tries again."""
        try:
            return await self.reconcile_pass()
        except Fenced as e:
            # A deposed leader's pass: nothing it decided was written or sent. Say so once a pass,
            # without a traceback, and have the lease looked at now.
            log.warning("reconcile pass refused by the store: %s", e)
            self.ctx.on_fenced()
        except Exception as e:
            if why := store_mod.unreachable(e):
                log.warning("reconcile pass: the database did not answer (%s); trying again", why)
            else:
                log.exception("reconcile pass failed; trying again")
        return False

    def _sample_history(self) -> None:
        """The charts' gauges, every couple of seconds: each model's queue and in flight, its replicas by state."""
        now = self.clock()
        if not self.history.due(now):
            return
        gauges: dict[str, tuple[float, float]] = {}
        for model in self.signals.models(now):
            merged = self.signals.signals(model, now)
            if merged is not None:
                gauges[model] = (merged.waiting, merged.in_flight)
        self.history.sample(now, gauges, (st for v in self.nodes.values() for st in v.shards.values()))

    def reconcile_once(self) -> bool:
        """One pass with every store call inline; True when it created replicas and another pass should place them."""
        now = self._expire(self.clock())
        models, replicas = read_targets(self.store)
        plan = self.planner.plan(models, replicas, self.nodes, frozenset(self.node_manager.drained), now=now,
                                 seen=self.planner.observe(models, now))
        write_targets(self.store, plan)
        self._apply(plan)
        self.sleeper.step(models, replicas, now)
        return plan.again

    async def reconcile_pass(self) -> bool:
        """``reconcile_once``, with the store on its thread and the pure part in a worker thread."""
        if self.db is None:
            return self.reconcile_once()
        now = self._expire(self.clock())
        models, replicas = await self.db.call(read_targets, self.store)
        # Measured in-process, 10,000 nodes and 100 models: deciding and deriving conditions held
        # the loop 30-120 ms a pass; in a thread the loop gets the GIL back every 5 ms (switch interval).
        plan = await asyncio.to_thread(self.planner.plan, models, replicas, dict(self.nodes),
                                       frozenset(self.node_manager.drained), now=now,
                                       seen=self.planner.observe(models, now))
        await self.db.call(write_targets, self.store, plan)
        self._apply(plan)
        self.sleeper.step(models, replicas, now)
        return plan.again

    def _expire(self, now: float) -> float:
        """A pass's first steps: silent streams closed, then nodes past their grace said NotReady."""
        self.links.update(now)
        self.node_manager.update(now)
        return now

    def _apply(self, plan: Plan) -> None:
        """On the loop, once the targets are written: the managers take the pass in, then the commands go out."""
        self.autoscaling.apply(plan)
        self.recorder.apply(plan)
        self.node_manager.apply(plan)
        self.recorder.flush()
        self.executor.apply(plan)

    # -- handed to the manager whose job it is (its docstring says what it does) ---------------------
    def record(self, event: ev.Event) -> None:
        self.recorder.record(event)

    def flush_events(self) -> None:
        self.recorder.flush()

    def conditions_of(self, obj: str) -> tuple[cond.Condition, ...]:
        return self.recorder.conditions_of(obj)

    def autoscaled(self, name: str) -> StoredAutoscale | None:
        return self.autoscaling.autoscaled(name)

    def set_scheduling(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        return self.node_manager.set_scheduling(node_id, cordoned=cordoned, draining=draining)

    async def mark_node(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        return await self.node_manager.mark(node_id, cordoned=cordoned, draining=draining)

    def endpoints_doc(self) -> routing.EndpointsDoc:
        return self.table.doc()

    async def wait_table(self, *, after: int | None, timeout: float) -> routing.EndpointsDoc:
        return await self.table.wait(after=after, timeout=timeout)

    async def close(self) -> None:
        """Answers every waiting long poll now, so a shutdown does not wait out their timeouts."""
        await self.table.close()
        if self.remote_meta is not None:
            await self.remote_meta.close()

    def connected(self, node_id: str) -> bool:
        return self.links.connected(node_id)

    def link(self, node_id: str) -> AgentLink | None:
        return self.links.link(node_id)

    def provisioned(self, node_id: str) -> Provision | None:
        return self.links.provisioned.get(node_id)

    def send_engine_removal(self, node_id: str, remove: Provision) -> bool:
        return self.executor.send_engine_removal(node_id, remove)

    async def revoke_node(self, node_id: str) -> int:
        return await self.links.revoke(node_id)

    def logs(self, node_id: str, shard_id: str, *, lines: int, follow: bool) -> AsyncIterator[list[str]]:
        return self.links.logs(node_id, shard_id, lines=lines, follow=follow)
