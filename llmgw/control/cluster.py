"""The control plane's runtime: observations in memory, targets in the store, one reconcile loop.

This class owns every effect of a decision: store writes and commands to
agents. The decision itself is ``reconcile.decide.reconcile``, pure, so this
loop only reads, decides, writes the targets, then sends. It is woken by
anything that changes the picture (an apply, a registration, a shard status)
and otherwise looks again every second, because time passing is a change too
(a startup timeout, a backoff ending).

In ``llmgw server`` nothing here holds the event loop that the agents' streams,
the REST API and the in-process router share: store calls go to the store's
thread (``store.offloop``; writes nobody waits on are queued there in order),
and the pure part of a pass (decide, then conditions and events over every
node) runs in a worker thread on a snapshot: ``dict(self.nodes)``, taken on
the loop. That copy is consistent because a ``NodeView`` in ``self.nodes`` is
never changed in place except for a heartbeat's rebinding of ``inventory`` and
``shard_load`` (whole values); anything else (a shard's status, a disconnect,
a cordon) puts a new view in its place, so the thread's view keeps what it had.
Without a store thread (unit tests, ``Cluster(store)``) every call runs inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Concatenate, ParamSpec, Protocol

from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control import loadreports, remotemeta
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.status import summarize
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Fenced, Store, StoredAutoscale, StoredNode
from llmgw.core import autoscale, fabrictest, specs
from llmgw.core.inventory import Heartbeat
from llmgw.core.provision import Provision
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)
P = ParamSpec("P")
#: How long a RemoveWeights its node still lists waits before it is asked again: the agent's
#: next weights rescan shows the removal, and one lost with a dropped stream is not lost for good.
_REMOVE_RESEND_S = 600.0


class AgentLink(Protocol):
    """The stream to one agent, as the agent service provides it."""

    def start_shard(self, spec: ShardSpec) -> None: ...
    def stop_shard(self, shard_id: str, *, reason: str) -> None: ...
    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None: ...
    def remove_weights(self, cache_name: str) -> None: ...
    def provision(self, provision: Provision) -> None: ...
    def controlplanes(self, addrs: tuple[str, ...]) -> None: ...
    def close(self, reason: str) -> None: ...
    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> tuple[str, asyncio.Queue[Any]]: ...
    def cancel_logs(self, request_id: str) -> None: ...
    def fabric_test(self, req: fabrictest.FabricTestRequest) -> asyncio.Future[fabrictest.FabricTestResult]: ...
    def forget_fabric_test(self, test_id: str) -> None: ...


@dataclasses.dataclass(slots=True)
class _Conn:
    link: AgentLink
    last_heartbeat: float


@dataclasses.dataclass(slots=True)
class _Plan:
    """What one pass decided and derived, made off the loop; written, then applied on the loop."""

    decisions: list[d.Decision]
    now: float
    upserts: list[ReplicaRecord] = dataclasses.field(default_factory=list)
    deletes: list[str] = dataclasses.field(default_factory=list)
    #: Another pass should follow at once (replicas were created: place them).
    again: bool = False
    #: In the order they happened; ``record`` drops repeats when they are applied.
    events: list[ev.Event] = dataclasses.field(default_factory=list)
    #: Conditions that changed, by "replica/ID" and "model/NAME", and the same for the store.
    conds: dict[str, tuple[cond.Condition, ...]] = dataclasses.field(default_factory=dict)
    changed_replicas: dict[str, tuple[cond.Condition, ...]] = dataclasses.field(default_factory=dict)
    changed_models: dict[str, tuple[cond.Condition, ...]] = dataclasses.field(default_factory=dict)
    #: Conditions of models that are gone.
    conds_gone: list[str] = dataclasses.field(default_factory=list)
    #: Draining nodes that no replica is on any more.
    drained: list[str] = dataclasses.field(default_factory=list)
    #: Each connected node's engines as wanted now (``reconcile.engines``); sent where they changed.
    provisions: dict[str, Provision] = dataclasses.field(default_factory=dict)
    #: The wants and settings they were worked out from: stale once either is rebound (see ``_apply``).
    provisioned_from: tuple[object, object] = (None, None)
    #: Autoscaler states that changed (written before the replicas), and those of models no longer autoscaled.
    autoscale: list[StoredAutoscale] = dataclasses.field(default_factory=list)
    autoscale_gone: list[str] = dataclasses.field(default_factory=list)
    #: Each autoscaled model's ``Autoscaling`` condition, added to its model conditions.
    autoscaling: dict[str, cond.Condition] = dataclasses.field(default_factory=dict)


def _read_targets(store: Store) -> tuple[dict[str, specs.ModelSpec], list[ReplicaRecord]]:
    return {m.model.name: m.model.spec for m in store.list_models()}, store.list_replicas()


@dataclasses.dataclass(frozen=True, slots=True)
class _Loaded:
    """What a control plane reads from the store when it starts leading."""

    nodes: list[StoredNode]
    replica_conds: dict[str, tuple[cond.Condition, ...]]
    model_conds: dict[str, tuple[cond.Condition, ...]]
    wants: tuple[provisioning.ScopedWant, ...]
    settings: dict[str, str]
    autoscale: dict[str, StoredAutoscale] = dataclasses.field(default_factory=dict)


def _load(store: Store) -> _Loaded:
    replica_conds, model_conds = store.conditions()
    return _Loaded(store.list_nodes(), replica_conds, model_conds, tuple(store.list_engine_wants()), store.settings(),
                   store.autoscale_states())


def in_force(models: Mapping[str, specs.ModelSpec],
             states: Mapping[str, StoredAutoscale]) -> dict[str, specs.ModelSpec]:
    """The models with each autoscaled one's ``replicas`` set to the autoscaler's count in force.

    Before its first stored state an autoscaled model runs ``min_replicas`` (what ``parse_manifest`` put in
    ``replicas``). Everything that counts replicas (reconcile, status, conditions, the router's table) reads
    these, never the bare spec: the spec's ``replicas`` is only the floor.
    """
    out = dict(models)
    for name, spec in models.items():
        st = states.get(name)
        if spec.autoscale is not None and st is not None and st.replicas != spec.replicas:
            out[name] = dataclasses.replace(spec, replicas=st.replicas)
    return out


def _state(a: StoredAutoscale) -> autoscale.State:
    return autoscale.State(replicas=a.replicas, above_since=a.above_since, below_since=a.below_since,
                           idle_since=a.idle_since, last_scale_up_at=a.last_scale_up_at,
                           last_change_at=a.last_change_at)


def _stored(name: str, st: autoscale.State, reason: str) -> StoredAutoscale:
    return StoredAutoscale(name, st.replicas, st.above_since, st.below_since, st.idle_since, st.last_scale_up_at,
                           st.last_change_at, reason)


def _write_targets(store: Store, plan: _Plan) -> None:
    """The pass's autoscaler states and targets, then its conditions (whose rows must exist by then).

    The count in force is written before the replicas it asks for: a leader that fails over between the two
    leaves a count whose replicas the next leader creates, never replicas that no stored count explains.
    """
    if plan.autoscale or plan.autoscale_gone:
        store.write_autoscale(upserts=plan.autoscale, deletes=plan.autoscale_gone)
    if plan.upserts or plan.deletes:
        store.write_replicas(upserts=plan.upserts, deletes=plan.deletes, now=plan.now)
    if plan.changed_replicas or plan.changed_models:
        store.set_conditions(replicas=plan.changed_replicas, models=plan.changed_models)


class Cluster:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time,
                 cfg: decide.Config = decide.Config(), heartbeat_timeout_s: float = 20.0,
                 interval_s: float = 1.0, ejections: Callable[[], dict[str, str]] | None = None,
                 db: StoreThread | None = None, remote_meta: remotemeta.Reader | None = None,
                 standby: bool = False, signals: loadreports.RouterSignals | None = None) -> None:
        self.store, self.clock, self.cfg = store, clock, cfg
        #: What routers report of each model's load (issue 17): the autoscaler's input. A report that holds
        #: a request for a model at zero kicks a pass at once, so its replica starts without waiting a tick.
        self.signals = signals if signals is not None else loadreports.RouterSignals(clock=clock)
        self.signals.on_wake = self._woken
        #: Each autoscaled model's autoscaler state as last written (loaded when this control plane leads).
        self._autoscale: dict[str, StoredAutoscale] = {}
        #: Reads remote sources' metadata before their replicas are placed (None: placed without it).
        self.remote_meta = remote_meta
        if remote_meta is not None:
            remote_meta.on_read = self.kick  # an answer lets the replicas waiting for it be placed
        #: (node, cache name) -> when RemoveWeights was sent, until the node stops listing it.
        self._removing: dict[tuple[str, str], float] = {}
        #: Where store calls run in the server (None: inline, on the caller's thread).
        self.db = db
        #: The replicas routers have ejected now, with their sentence (``RouterEvents.current``):
        #: evidence for an Unhealthy replica's grace, never a reason alone (``reconcile.liveness``).
        self.ejections = ejections or dict
        self.heartbeat_timeout_s, self.interval_s = heartbeat_timeout_s, interval_s
        #: Whether this control plane leads (``llmgw.control.leader``): only a leader accepts agents, reconciles,
        #: writes and sends commands; a standby only publishes the router's table from the store. Without
        #: election (unit tests, ``Cluster(store)``) it leads from the start.
        self.leading = not standby
        #: The term it leads at (0: no election); every command carries it, agents refuse older ones.
        self.term = 0
        #: Whether the lease is still fresh enough to act on (``Leadership.valid``); checked before commands go out.
        self.may_act: Callable[[], bool] = lambda: True
        #: Called when the store refused a write as fenced (``Leadership.kick``: check the lease now).
        self.on_fenced: Callable[[], None] = lambda: None
        #: For a standby's refusal of an agent: (the leader's agent address or "", every control plane's).
        self.hint: Callable[[], tuple[str, tuple[str, ...]]] = lambda: ("", ())
        #: The control planes' addresses as last sent to the connected agents (``_announce_peers``).
        self._peers: tuple[str, ...] = ()
        self.started_at = clock()
        self.nodes: dict[str, NodeView] = {}
        self._conns: dict[str, _Conn] = {}
        self._wake = asyncio.Event()
        self._table_changed = asyncio.Condition()
        self._table: dict[str, Any] = {"version": 0, "models": []}
        self._closing = False
        #: Events not yet written: a registration storm costs one write a pass, not one a node.
        self._events: list[ev.Event] = []
        #: (reason, message) of each object's last event, so a repeat is not written again.
        self._last_event: dict[str, tuple[str, str]] = {}
        #: Nodes already said NotReady (past their grace) or fully drained.
        self._lost: set[str] = set()
        self._drained: set[str] = set()
        #: Conditions as last written, by "replica/ID" and "model/NAME" (loaded: transition times survive a restart).
        self._conds: dict[str, tuple[cond.Condition, ...]] = {}
        #: Operators' engine wants and the cluster's engine settings (``control.engines`` rebinds them on a change).
        self.engine_wants: tuple[provisioning.ScopedWant, ...] = ()
        self.engine_settings = provisioning.EngineSettings.from_map({})
        #: The Provision last sent on each node's current stream: sent again only when it changes.
        self._provisioned: dict[str, Provision] = {}
        if not standby:
            self._take(_load(store))

    def _take(self, loaded: _Loaded) -> None:
        """Starts from the store's picture, as at a start: every node known but not heard from yet."""
        self.started_at = self.clock()
        self.nodes, self._conds, self._provisioned = {}, {}, {}
        self._lost, self._drained, self._last_event, self._removing = set(), set(), {}, {}
        self.engine_wants = loaded.wants
        self.engine_settings = provisioning.EngineSettings.from_map(loaded.settings)
        self._autoscale = dict(loaded.autoscale)
        self._conds.update({f"replica/{k}": v for k, v in loaded.replica_conds.items()})
        self._conds.update({f"model/{k}": v for k, v in loaded.model_conds.items()})
        for stored in loaded.nodes:
            # Known but not heard from since this start (or this takeover): disconnected since now, so
            # its replicas get the full grace period to be reported. This is what makes a failover cost
            # no engine restart: nothing is decided about a node's shards until it registered or its
            # grace passed, and its Register lists the shards it still runs.
            self.nodes[stored.id] = NodeView(stored.id, stored.inventory, connected=False,
                                             disconnected_since=self.started_at, mgmt_addr=stored.mgmt_addr,
                                             cordoned=stored.cordoned, draining=stored.draining)

    # -- leading and standing by (issue 15) -----------------------------------------------
    async def take_over(self, term: int) -> None:
        """Starts leading at ``term``: reads the store's picture afresh (it moved on while this one stood by)."""
        loaded = _load(self.store) if self.db is None else await self.db.call(_load, self.store)
        self._take(loaded)
        self.term, self.leading = term, True
        self._events = []
        log.info("leading at term %d: %d nodes known, each has %.0fs to register before its replicas are "
                 "replaced", term, len(self.nodes), self.cfg.node_grace_s)
        self.record(ev.Event(self.clock(), ev.NORMAL, "LeaderElected", "controlplane/leader",
                             f"this control plane leads at term {term}; {len(self.nodes)} nodes have "
                             f"{self.cfg.node_grace_s:.0f}s to register"))
        self.kick()

    def step_down(self, reason: str) -> None:
        """Stops leading at once: every agent stream is closed (each agent redials and is sent to the
        leader), nothing more is written or sent, and the in-memory picture is dropped."""
        self.leading = False
        self._events = []
        for conn in list(self._conns.values()):
            conn.link.close(f"this control plane no longer leads ({reason})")
        self._conns.clear()
        self.nodes = {}
        self._provisioned = {}
        self.kick()

    # -- what agents report --------------------------------------------------------
    def node_registered(self, node: StoredNode, shards: list[ShardStatus], link: AgentLink) -> None:
        old = self._conns.get(node.id)
        if old is not None and old.link is not link:
            old.link.close("replaced by a newer stream from the same node")
        self._conns[node.id] = _Conn(link, self.clock())
        self._provisioned.pop(node.id, None)  # a new stream: the next pass sends it its Provision
        # Cordon and drain are the operator's, not the agent's: a registration keeps them.
        prev = self.nodes.get(node.id)
        self.nodes[node.id] = NodeView(node.id, node.inventory, connected=True, mgmt_addr=node.mgmt_addr,
                                       shards={s.shard_id: s for s in shards}, reported=True,
                                       registered_at=self.clock(), cordoned=bool(prev and prev.cordoned),
                                       draining=bool(prev and prev.draining), labels=dict(node.labels))
        # A reconnect does not restart the grace of a shard already known Unhealthy.
        since = prev.unhealthy_since if prev is not None else {}
        for st in shards:
            self._stamp_unhealthy(self.nodes[node.id], st, since=since.get(st.shard_id))
        self._write(Store.upsert_node, node)
        self._lost.discard(node.id)
        self.record(ev.Event(self.clock(), ev.NORMAL, "NodeRegistered", f"node/{node.id}",
                             f"registered: {node.inventory.cpu_count} CPUs, {len(node.inventory.gpus)} GPUs, "
                             f"{len(shards)} shards running", node=node.id))
        log.info("node %s registered: %d CPUs, %d GPUs, engines %s, %d shards running", node.id,
                 node.inventory.cpu_count, len(node.inventory.gpus),
                 ",".join(n for n, _ in node.inventory.engines) or "none", len(shards))
        self.kick()

    def node_heartbeat(self, node_id: str, hb: Heartbeat) -> None:
        view, conn = self.nodes.get(node_id), self._conns.get(node_id)
        if view is None or conn is None:
            return
        conn.last_heartbeat = self.clock()
        inv = view.inventory
        changes: dict[str, object] = {
            "memory_total_bytes": hb.memory_total_bytes or inv.memory_total_bytes,
            "memory_available_bytes": hb.memory_available_bytes,
            "hcas": hb.hcas,  # every heartbeat: a port that went down counts at once
        }
        if hb.gpus:
            changes["gpus"] = hb.gpus
        if hb.disks:
            changes["disks"] = hb.disks
        for name in ("weights", "fabrics", "engines", "model_dirs", "nvlink", "subnet_managers", "installs"):
            value = getattr(hb, name)
            if value is not None:  # None: unchanged since the last message
                changes[name] = value
        # Rebound in place, each a whole new value: the one change a view takes without being
        # replaced (see the module docstring). A new view per beat would cost every heartbeat ~10 us more.
        view.inventory = dataclasses.replace(inv, **changes)  # type: ignore[arg-type]
        view.shard_load = {s.shard_id: s for s in hb.shard_load}
        if hb.installs is not None and hb.installs != inv.installs:
            for e in provisioning.install_events(node_id, inv.installs, hb.installs, now=self.clock()):
                self.record(e)
            self.kick()  # an install Ready (or Failed) changes what placement can do, and says so

    def shard_reported(self, node_id: str, status: ShardStatus) -> None:
        view = self.nodes.get(node_id)
        if view is None:
            return
        # A new view, not the old one changed: a pass in its thread may be reading the old one,
        # and a dict that grows under its iteration raises there.
        before = view.shards.get(status.shard_id)
        view = self.nodes[node_id] = dataclasses.replace(
            view, shards={**view.shards, status.shard_id: status}, unhealthy_since=dict(view.unhealthy_since))
        self._stamp_unhealthy(view, status)
        # A fetch's progress comes once a second for as long as the download lasts (hours, for a
        # big model): only its first report and its changes of state are worth a line at INFO.
        again = before is not None and before.state is status.state is ShardState.FETCHING and \
            (before.fetch.state if before.fetch else "") == (status.fetch.state if status.fetch else "")
        log.log(logging.DEBUG if again else logging.INFO, "node %s shard %s %s%s", node_id, status.shard_id,
                status.state.value, f": {status.message}" if status.message else "")
        self.kick()

    def _stamp_unhealthy(self, view: NodeView, status: ShardStatus, *, since: float | None = None) -> None:
        """Notes when a shard was first said Unhealthy (its grace starts there); forgets it once it is not."""
        if status.state is ShardState.UNHEALTHY:
            view.unhealthy_since.setdefault(status.shard_id, since if since is not None else self.clock())
        else:
            view.unhealthy_since.pop(status.shard_id, None)

    def node_leaving(self, node_id: str, reason: str) -> None:
        """The node's agent is stopping (its Goodbye): nothing is placed there until it registers again."""
        view = self.nodes.get(node_id)
        if view is None or view.leaving:
            return
        self.nodes[node_id] = dataclasses.replace(view, leaving=reason[:200] or "its agent is stopping")
        log.info("node %s is leaving: %s", node_id, reason)
        self.record(ev.Event(self.clock(), ev.NORMAL, "NodeLeaving", f"node/{node_id}",
                             f"its agent is stopping ({reason[:200]}); nothing new is placed on it until it "
                             "registers again", node=node_id))
        self.kick()

    def node_disconnected(self, node_id: str, link: AgentLink) -> None:
        conn = self._conns.get(node_id)
        if conn is None or conn.link is not link:
            return  # an older stream ending after a newer one registered (or closed by a step-down)
        del self._conns[node_id]
        if not self.leading:
            return
        view = self.nodes.get(node_id)
        if view is not None:
            view = self.nodes[node_id] = dataclasses.replace(view, connected=False,
                                                             disconnected_since=self.clock())
            self._write(Store.touch_nodes, {node_id: view.disconnected_since})
        log.warning("node %s disconnected", node_id)
        self.record(ev.Event(self.clock(), ev.WARNING, "NodeDisconnected", f"node/{node_id}",
                             f"its stream ended; its replicas stay for {self.cfg.node_grace_s:.0f}s "
                             "before they are placed elsewhere", node=node_id))
        self.kick()

    # -- the loop --------------------------------------------------------------------
    def kick(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            # Cleared before the pass reads anything, so a kick during the pass (an apply
            # while it was in its thread) gets another pass at once instead of the next tick.
            self._wake.clear()
            again = False
            if self.leading:
                try:
                    again = await self.reconcile_pass()
                except Fenced as e:
                    # A deposed leader's pass: nothing it decided was written or sent. Say so once a pass,
                    # without a traceback, and have the lease looked at now.
                    log.warning("reconcile pass refused by the store: %s", e)
                    self.on_fenced()
                except Exception as e:
                    if why := store_mod.unreachable(e):
                        log.warning("reconcile pass: the database did not answer (%s); trying again", why)
                    else:
                        log.exception("reconcile pass failed; trying again")
            try:
                await self._publish_table()
            except Exception as e:
                # Routers keep the last table; before, this ended the loop and with it the server, on a
                # database restart (seen with PostgreSQL stopped for one second).
                if not (why := store_mod.unreachable(e)):
                    raise
                log.warning("the router's table was not refreshed: the database did not answer (%s)", why)
            self._announce_peers()
            # Give the event loop at least as long as the pass took before the next one:
            # passes kicked back to back by a thousand re-registering agents held the
            # loop so the registrations themselves crawled (~18 a second, seen with the
            # fleet simulator), and the nodes' grace ran out before they had reported.
            await asyncio.sleep(min(1.0, time.perf_counter() - started))
            if again:
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except TimeoutError:
                pass

    def reconcile_once(self) -> bool:
        """One pass with every store call inline; True when it created replicas and another pass should place them."""
        now = self.clock()
        self._expire_silent(now)
        self._announce_lost(now)
        models, replicas = _read_targets(self.store)
        signals, load = self._observed_load(models, now)
        plan = self._plan(models, replicas, self.nodes, frozenset(self._drained), now=now, ejected=self.ejections(),
                          remote=self._remote(models), removing=self._still_removing(now), signals=signals, load=load)
        _write_targets(self.store, plan)
        self._apply(plan)
        return plan.again

    async def reconcile_pass(self) -> bool:
        """``reconcile_once``, with the store on its thread and the pure part in a worker thread."""
        if self.db is None:
            return self.reconcile_once()
        now = self.clock()
        self._expire_silent(now)
        self._announce_lost(now)
        models, replicas = await self.db.call(_read_targets, self.store)
        # Read on the loop, where reports are recorded: RouterSignals is not for two threads at once.
        signals, load = self._observed_load(models, now)
        # Measured in-process, 10,000 nodes and 100 models: deciding and deriving conditions held
        # the loop 30-120 ms a pass; in a thread the loop gets the GIL back every 5 ms (switch interval).
        plan = await asyncio.to_thread(self._plan, models, replicas, dict(self.nodes), frozenset(self._drained),
                                       now=now, ejected=self.ejections(), remote=self._remote(models),
                                       removing=self._still_removing(now), signals=signals, load=load)
        await self.db.call(_write_targets, self.store, plan)
        self._apply(plan)
        return plan.again

    def _remote(self, models: dict[str, specs.ModelSpec]) -> dict[str, decide.fit.RemoteWeights] | None:
        """Remote sources' metadata read so far; reads of the ones not read yet start now (off the loop)."""
        if self.remote_meta is None:
            return None
        with contextlib.suppress(RuntimeError):  # no running loop: reconcile_once in a unit test
            self.remote_meta.want(models.values())
        return self.remote_meta.known()

    def _still_removing(self, now: float) -> frozenset[tuple[str, str]]:
        """RemoveWeights sent that their nodes still list; asked again once ``_REMOVE_RESEND_S`` has passed."""
        for key, sent in list(self._removing.items()):
            view = self.nodes.get(key[0])
            listed = view is not None and any(w.cache_name == key[1] for w in view.inventory.weights)
            if not listed or now - sent > _REMOVE_RESEND_S:
                del self._removing[key]
        return frozenset(self._removing)

    # -- autoscaling (issue 17) --------------------------------------------------------------
    def _woken(self, model: str) -> None:
        """A router holds a request for ``model`` (at zero): a pass now, so its replica starts without a tick's wait."""
        self.kick()

    def _observed_load(self, models: Mapping[str, specs.ModelSpec], now: float
                       ) -> tuple[dict[str, autoscale.Signals | None], dict[str, float]]:
        """The routers' merged signals of each autoscaled model, and the in-flight count of every replica."""
        return ({name: self.signals.signals(name, now) for name, spec in models.items() if spec.autoscale is not None},
                self.signals.load())

    def _autoscale_pass(self, plan: _Plan, models: dict[str, specs.ModelSpec], replicas: list[ReplicaRecord],
                        signals: Mapping[str, autoscale.Signals | None], now: float) -> dict[str, specs.ModelSpec]:
        """Decides each autoscaled model's count (into ``plan``); returns the models with their counts in force.

        Pure over its arguments and ``self._autoscale`` (changed only by ``_apply``, on the loop).
        """
        by_model: dict[str, list[ReplicaRecord]] = {}
        for r in replicas:
            by_model.setdefault(r.model, []).append(r)
        states: dict[str, StoredAutoscale] = {}
        for name, spec in models.items():
            auto = spec.autoscale
            if auto is None:
                continue
            mine, fp = by_model.get(name, []), spec.fingerprint()
            prev = self._autoscale.get(name)
            if prev is not None:
                start = _state(prev)
            else:
                # A model that just became autoscaled keeps the replicas it runs, within the bounds: starting
                # at min_replicas would drain replicas serving load before a single report was read.
                running = sum(1 for r in mine if r.phase is not Phase.TERMINATING and r.fingerprint == fp)
                start = (autoscale.State(replicas=min(max(running, auto.min_replicas), max(auto.max_replicas, 1)))
                         if running else autoscale.initial(auto))
            # A replica of an old fingerprint means a rollout is in flight: its surge and drain move the load
            # per replica, and a count decided on that would fight the roll.
            rolling = any(r.fingerprint != fp for r in mine)
            # A replica of this model refused a node (not one waiting out a failure's backoff): asking for
            # more would only queue more that cannot be placed, a pass after pass loop.
            unplaceable = next((r.message for r in mine if r.phase is Phase.PENDING and r.message
                                and not r.failures and r.fingerprint == fp), "")
            out = autoscale.decide(auto, signals.get(name), start, now=now, rolling=rolling, unplaceable=unplaceable)
            stored = _stored(name, out.state, out.reason or (prev.last_reason if prev is not None else ""))
            states[name] = stored
            if stored != prev:
                plan.autoscale.append(stored)
            if out.reason:
                plan.events.append(ev.Event(now, ev.NORMAL, "Autoscaled", f"model/{name}", out.reason, model=name))
            plan.autoscaling[name] = cond.autoscaling(spec, replicas=out.state.replicas, limited=out.limited,
                                                      unplaceable=bool(unplaceable) and out.limited == unplaceable)
        plan.autoscale_gone = [name for name in self._autoscale if name not in states]
        return in_force(models, states)

    def autoscaled(self, name: str) -> StoredAutoscale | None:
        """A model's autoscaler state as this leader last wrote it (None: not autoscaled, or not leading)."""
        return self._autoscale.get(name)

    def _plan(self, models: dict[str, specs.ModelSpec], replicas: list[ReplicaRecord],
              nodes: Mapping[str, NodeView], drained: frozenset[str], *, now: float,
              ejected: dict[str, str], remote: Mapping[str, decide.fit.RemoteWeights] | None = None,
              removing: frozenset[tuple[str, str]] = frozenset(),
              signals: Mapping[str, autoscale.Signals | None] | None = None,
              load: Mapping[str, float] | None = None) -> _Plan:
        """Pure over its arguments, ``self._conds`` and ``self._autoscale`` (changed only by ``_apply``, on the
        loop): safe in a thread."""
        plan = _Plan(decisions=[], now=now)
        models = self._autoscale_pass(plan, models, replicas, signals or {}, now)
        out = plan.decisions = decide.reconcile(models, replicas, nodes, now=now, cfg=self.cfg, ejected=ejected,
                                                remote=remote, removing=removing, load=load)
        for dec in out:
            if isinstance(dec, d.UpdateReplica):
                plan.upserts.append(dec.record)
            elif isinstance(dec, d.DeleteReplica):
                plan.deletes.append(dec.replica_id)
            elif isinstance(dec, d.CreateReplica):
                plan.upserts.append(ReplicaRecord(
                    id=f"{dec.model}-{secrets.token_hex(3)}", model=dec.model, fingerprint=dec.fingerprint,
                    # Prefixed: a urlsafe token starts with "-" one time in 64, and an engine's
                    # argument parser then reads the key as a flag (seen in CI: "argument
                    # --api-key: expected one argument", and the replica crash-looped).
                    phase=Phase.PENDING, api_key=f"sk-{secrets.token_urlsafe(24)}", created_at=now))
                plan.again = True
        self._derive(plan, models, replicas, nodes, drained, now)
        wants, settings = self.engine_wants, self.engine_settings
        plan.provisioned_from = (wants, settings)
        plan.provisions = provisioning.provisions((n for n in nodes.values() if n.connected), wants, models, settings)
        return plan

    def _apply(self, plan: _Plan) -> None:
        """On the loop, once the targets are written: events, conditions as held, then commands to agents."""
        self._autoscale.update({a.model: a for a in plan.autoscale})
        for name in plan.autoscale_gone:
            self._autoscale.pop(name, None)
        for e in plan.events:
            self.record(e)
        for rid in plan.deletes:
            self._conds.pop(f"replica/{rid}", None)
            self._last_event.pop(f"replica/{rid}", None)
        self._conds.update(plan.conds)
        for key in plan.conds_gone:
            self._conds.pop(key, None)
        for node_id in plan.drained:
            view = self.nodes.get(node_id)
            if view is not None and view.draining:  # not uncordoned while the pass ran
                self._drained.add(node_id)
                self.record(ev.Event(plan.now, ev.NORMAL, "NodeDrained", f"node/{node_id}",
                                     "every replica has moved off; it stays cordoned until `llmgw uncordon`",
                                     node=node_id))
        self.flush_events()
        if not (self.leading and self.may_act()):
            # The lease may have lapsed while the pass ran: its targets were written under the fence, but
            # commands go out only while this control plane still knows it leads.
            log.warning("not sending the pass's commands: this control plane's lease is not fresh")
            return
        for dec in plan.decisions:  # only after the targets are written
            if isinstance(dec, d.StartShard):
                self._send(dec.node_id, lambda link, dec=dec: link.start_shard(dec.spec))
            elif isinstance(dec, d.DrainShard):
                self._send(dec.node_id, lambda link, dec=dec: link.drain_shard(dec.shard_id, timeout_s=dec.timeout_s))
            elif isinstance(dec, d.StopShard):
                self._send(dec.node_id, lambda link, dec=dec: link.stop_shard(dec.shard_id, reason=dec.reason))
            elif isinstance(dec, d.RemoveWeights):
                self._removing[(dec.node_id, dec.cache_name)] = plan.now
                self._send(dec.node_id, lambda link, dec=dec: link.remove_weights(dec.cache_name))
        # Worked out before a want changed: sending them could undo an `engine remove` made while the pass
        # ran (its removal sent, then the old want again); the change kicked a pass that sends the new ones.
        stale = plan.provisioned_from != (self.engine_wants, self.engine_settings)
        for node_id, prov in ({} if stale else plan.provisions).items():
            last, view = self._provisioned.get(node_id), self.nodes.get(node_id)
            if last is None and not prov.wants and (view is None or not view.inventory.installs):
                continue  # nothing wanted, nothing installed: an empty Provision would say nothing new
            if node_id in self._conns and last != prov:
                self._provisioned[node_id] = prov
                self._send(node_id, lambda link, prov=prov: link.provision(prov))

    def _announce_peers(self) -> None:
        """Tells every connected agent the control planes' addresses when they changed (a standby started
        after the agents registered): an agent that knew only the leader would otherwise never find the
        standby when the leader dies, and its engines would be replaced after its grace."""
        peers = self.hint()[1]
        if not self.leading or peers == self._peers:
            return
        self._peers = peers
        for conn in self._conns.values():
            conn.link.controlplanes(peers)

    # -- conditions and events ------------------------------------------------------------
    def record(self, event: ev.Event) -> None:
        """Queues an event for the next write, unless it repeats the object's last one."""
        key = (event.reason, event.message)
        if not self.leading or self._last_event.get(event.object) == key:
            return
        self._last_event[event.object] = key
        self._events.append(event)

    def flush_events(self) -> None:
        if self._events:
            batch, self._events = self._events, []
            self._write(Store.add_events, batch)

    def _write(self, method: Callable[Concatenate[Store, P], object], /, *args: P.args, **kwargs: P.kwargs) -> None:
        """A store write nobody waits on: queued on the store's thread (in order), or inline without one."""
        if self.db is None:
            method(self.store, *args, **kwargs)
        else:
            self.db.submit(method, self.store, *args, **kwargs)

    def conditions_of(self, obj: str) -> tuple[cond.Condition, ...]:
        """Conditions of "replica/ID" or "model/NAME" as of the last pass."""
        return self._conds.get(obj, ())

    def _derive(self, plan: _Plan, models: dict[str, specs.ModelSpec], before: list[ReplicaRecord],
                nodes: Mapping[str, NodeView], drained: frozenset[str], now: float) -> None:
        """Events for what the pass changed, then conditions (kept only where they changed), into ``plan``."""
        old = {r.id: r for r in before}
        after = dict(old)
        loop = self.cfg.crash_loop_after
        for r in plan.upserts:
            after[r.id] = r
            plan.events.extend(ev.replica_events(old.get(r.id), r, now=now, crash_loop_after=loop))
        for rid in plan.deletes:
            gone = after.pop(rid, None)
            plan.events.extend(ev.replica_events(gone, None, now=now, crash_loop_after=loop))
        for dec in plan.decisions:
            if isinstance(dec, d.RecordEvent):
                plan.events.append(dec.event)
            if isinstance(dec, d.StopShard) and dec.reason == decide.ORPHAN_REASON:
                plan.events.append(ev.Event(now, ev.NORMAL, "OrphanStopped", f"node/{dec.node_id}",
                                            f"stopping shard {dec.shard_id}: {dec.reason}", node=dec.node_id))
        by_model: dict[str, list[ReplicaRecord]] = {}
        replica_conds: dict[str, tuple[cond.Condition, ...]] = {}
        for r in after.values():
            by_model.setdefault(r.model, []).append(r)
            key = f"replica/{r.id}"
            prev = self._conds.get(key, ())
            new = cond.carry_times(cond.replica_conditions(r, models.get(r.model), nodes, now=now,
                                                           crash_loop_after=loop), prev, now=now)
            replica_conds[r.id] = new
            if new != prev:
                plan.conds[key] = plan.changed_replicas[r.id] = new
        for name, spec in models.items():
            key = f"model/{name}"
            prev = self._conds.get(key, ())
            extra = (plan.autoscaling[name],) if name in plan.autoscaling else ()
            new = cond.carry_times(cond.model_conditions(spec, by_model.get(name, []), replica_conds, nodes) + extra,
                                   prev, now=now)
            if new != prev:
                plan.events.extend(ev.condition_events(key, name, new, prev, now=now))
                plan.conds[key] = plan.changed_models[name] = new
        plan.conds_gone = [k for k in self._conds if k.startswith("model/") and k[6:] not in models]
        placed = {n for r in after.values() for n in (r.node_id, *(m.node_id for m in r.members))}
        plan.drained = [node.id for node in nodes.values()
                        if node.draining and node.id not in drained and node.id not in placed]

    def _announce_lost(self, now: float) -> None:
        for node in self.nodes.values():
            if not node.connected and node.id not in self._lost \
                    and now - node.disconnected_since > self.cfg.node_grace_s:
                self._lost.add(node.id)
                self.record(ev.Event(now, ev.WARNING, "NodeNotReady", f"node/{node.id}",
                                     f"silent for {now - node.disconnected_since:.0f}s, past its "
                                     f"{self.cfg.node_grace_s:.0f}s grace; its replicas are placed elsewhere",
                                     node=node.id))

    # -- cordon, uncordon, drain ----------------------------------------------------------
    def set_scheduling(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        """Persists then applies a node's marks; False when the node is not known."""
        if node_id not in self.nodes or not self.store.set_node_scheduling(node_id, cordoned=cordoned,
                                                                           draining=draining):
            return False
        self._marked(node_id, cordoned=cordoned, draining=draining)
        return True

    async def mark_node(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        """``set_scheduling``, the write awaited on the store's thread."""
        if self.db is None:
            return self.set_scheduling(node_id, cordoned=cordoned, draining=draining)
        if node_id not in self.nodes or not await self.db.set_node_scheduling(node_id, cordoned=cordoned,
                                                                              draining=draining):
            return False
        self._marked(node_id, cordoned=cordoned, draining=draining)
        return True

    def _marked(self, node_id: str, *, cordoned: bool, draining: bool) -> None:
        """Applies marks already stored: a new view (see the module docstring), an event, another pass."""
        self.nodes[node_id] = dataclasses.replace(self.nodes[node_id], cordoned=cordoned, draining=draining)
        self._drained.discard(node_id)
        if draining:
            reason, msg = "NodeDraining", ("draining: its replicas move to other nodes, each once its "
                                           "replacement is Ready")
        elif cordoned:
            reason, msg = "NodeCordoned", "cordoned: no new replica is placed here"
        else:
            reason, msg = "NodeUncordoned", "uncordoned: replicas may be placed here again"
        self.record(ev.Event(self.clock(), ev.NORMAL, reason, f"node/{node_id}", msg, node=node_id))
        self.flush_events()
        self.kick()

    def _send(self, node_id: str, fn: Callable[[AgentLink], None]) -> None:
        conn = self._conns.get(node_id)
        if conn is not None:  # otherwise the next pass sends it again once the node is back
            fn(conn.link)

    def _expire_silent(self, now: float) -> None:
        # Only the silent ones are copied out: a copy of every connection, each pass, held the
        # loop 15 ms a pass with 10,000 agents (bench/fleet.py), garbage collections included.
        limit = now - self.heartbeat_timeout_s
        silent = [(node_id, conn) for node_id, conn in self._conns.items() if conn.last_heartbeat < limit]
        for node_id, conn in silent:
            if now - conn.last_heartbeat > self.heartbeat_timeout_s:
                log.warning("node %s sent nothing for %.0fs; closing its stream", node_id,
                            now - conn.last_heartbeat)
                conn.link.close("no heartbeat")
                self.node_disconnected(node_id, conn.link)

    # -- the router's table ----------------------------------------------------------------
    def endpoints_doc(self) -> dict[str, Any]:
        now = self.clock()
        by_model: dict[str, list[ReplicaRecord]] = {}
        for r in self.store.list_replicas():
            by_model.setdefault(r.model, []).append(r)
        models = []
        states = self.store.autoscale_states()
        for stored in self.store.list_models():
            m = stored.model
            mine = by_model.get(m.name, [])
            spec = in_force({m.name: m.spec}, states)[m.name]
            st = summarize(spec, mine, now=now)
            auto = m.spec.autoscale
            # Read by the router (``table.ModelRoute.autoscale``): a model at zero with this is held, not refused.
            extra = {} if auto is None else {"autoscale": {"min_replicas": auto.min_replicas,
                                                           "max_replicas": auto.max_replicas,
                                                           "cold_start_timeout_s": auto.cold_start_timeout_s}}
            models.append({
                "name": m.name, "served_name": m.spec.served_name, "aliases": list(m.spec.aliases),
                "routing": m.spec.routing, "engine": m.spec.engine,
                # Read by the router's admission (llmgw.router.table); 0 is no limit.
                "limits": {"concurrency_per_replica": m.spec.max_concurrency_per_replica},
                "state": st.state, "message": st.message,
                "endpoints": [{"replica_id": r.id, "url": r.endpoint, "api_key": r.api_key}
                              for r in mine if r.phase is Phase.READY and r.endpoint],
                # Replicas out of routing because their engine stopped answering (``router.hung``): a
                # router gives up the requests still waiting for their first byte there and sends them
                # to another replica. Listed apart, because a replica that leaves ``endpoints`` to be
                # drained must keep its requests: they finish.
                "unhealthy": [{"replica_id": r.id, "reason": r.message} for r in mine
                              if r.phase is Phase.UNHEALTHY],
                **extra,
            })
        stored_keys = self.store.list_keys()
        keys = [{"id": k.id, "sha256": k.sha256, "models": list(k.models), "rpm": k.rpm, "tpm": k.tpm,
                 "priority": k.priority} for k in stored_keys if not k.disabled]
        # Required only once a key exists, so a fresh `make up` keeps answering without one. A disabled
        # key counts: with every key disabled everyone is refused, where following the enabled keys
        # opened the API to anyone the moment the last one was disabled.
        return {"models": models, "auth": {"required": bool(stored_keys), "keys": keys}}

    async def _publish_table(self) -> None:
        # Built where the store is read: it is store rows and a summary of each model, nothing of the loop's.
        doc = self.endpoints_doc() if self.db is None else await self.db.call(self.endpoints_doc)
        # Everything but the version is compared: a key created or deleted must reach the router too.
        if any(doc[k] != self._table.get(k) for k in doc):
            async with self._table_changed:
                self._table = {"version": self._table["version"] + 1, **doc}
                self._table_changed.notify_all()

    async def wait_table(self, *, after: int | None, timeout: float) -> dict[str, Any]:
        """The router's table; when ``after`` is its current version, waits up to ``timeout`` for a change."""
        if after is None or after != self._table["version"]:
            return self._table
        async with self._table_changed:
            try:
                await asyncio.wait_for(self._table_changed.wait_for(
                    lambda: self._closing or self._table["version"] != after), timeout)
            except TimeoutError:
                pass
        return self._table

    async def close(self) -> None:
        """Answers every waiting long poll now, so a shutdown does not wait out their timeouts."""
        async with self._table_changed:
            self._closing = True
            self._table_changed.notify_all()
        if self.remote_meta is not None:
            await self.remote_meta.close()

    def connected(self, node_id: str) -> bool:
        return node_id in self._conns

    def link(self, node_id: str) -> AgentLink | None:
        """The stream to a connected node, for a request that awaits its answer (a fabric test); None if not."""
        conn = self._conns.get(node_id)
        return conn.link if conn is not None else None

    def provisioned(self, node_id: str) -> Provision | None:
        """The Provision last sent to a connected node (None: none yet on its current stream)."""
        return self._provisioned.get(node_id)

    def send_engine_removal(self, node_id: str, remove: Provision) -> bool:
        """Sends a one-off Provision carrying ``remove`` to a connected node; False when it is not connected."""
        if node_id not in self._conns:
            return False
        # Its wants are the node's whole set as of now: the next pass sends nothing new unless they change.
        self._provisioned[node_id] = dataclasses.replace(remove, remove=())
        self._send(node_id, lambda link: link.provision(remove))
        return True

    async def revoke_node(self, node_id: str) -> int:
        """Revokes every certificate of ``node_id`` and closes its stream now; returns how many were revoked.

        The row first, then the close: the agent's next Connect (it redials at once) meets the revocation
        in the store and is refused there, so nothing is left for a timer to cut off.
        """
        at = self.clock()
        count = (await self.db.call(self.store.revoke_node_certs, node_id, at=at) if self.db is not None
                 else self.store.revoke_node_certs(node_id, at=at))
        conn = self._conns.get(node_id)
        if conn is not None:
            conn.link.close(f"its certificate was revoked ({count} revoked)")
        self.record(ev.Event(at, ev.WARNING, "NodeRevoked", f"node/{node_id}",
                             f"{count} certificate(s) revoked; the node is refused until it joins again",
                             node=node_id))
        self.flush_events()
        return count

    async def logs(self, node_id: str, shard_id: str, *, lines: int, follow: bool) -> AsyncIterator[list[str]]:
        """Lines of a node's agent log or of one of its shards, read over the node's stream."""
        conn = self._conns.get(node_id)
        if conn is None:
            if node_id in self.nodes:
                raise NodeNotConnected(f"node {node_id} is not connected now; its logs are on the node itself")
            raise KeyError(node_id)
        request_id, replies = conn.link.request_logs(shard_id, lines=lines, follow=follow)
        try:
            while True:
                batch = await replies.get()
                if batch.error:
                    raise LogsError(batch.error)
                yield list(batch.lines)
                if batch.done:
                    return
        finally:
            conn.link.cancel_logs(request_id)


class NodeNotConnected(Exception):
    pass


class LogsError(Exception):
    """The agent could not answer a logs request; the message says why."""
