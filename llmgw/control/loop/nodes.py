"""The nodes as the control plane sees them: what each agent reported (``NodeView``), and the operator's
marks on it (cordon, drain), told as event records as they change.

The views are what a pass decides on. A pass reads them in a worker thread from a copy of the dict taken on
the loop (``dict(views)``). That copy is consistent because a view here is never changed in place except
for a heartbeat's rebinding of ``inventory`` and ``shard_load`` (whole values); anything else (a shard's
status, a disconnect, a cordon) puts a new view in its place, so the thread's copy keeps what it had.
"""

from __future__ import annotations

import dataclasses
import logging

from llmgw.control import events as ev
from llmgw.control.loop.context import LoopContext
from llmgw.control.loop.plan import Loaded, Plan
from llmgw.control.loop.recorder import Recorder
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.state import NodeView
from llmgw.control.store.store import Store, StoredNode
from llmgw.core.inventory import Heartbeat
from llmgw.core.shards import ShardState, ShardStatus

log = logging.getLogger(__name__)
#: Heartbeat fields sent only when they changed (None: unchanged since the last message).
_CHANGED_ONLY = ("weights", "fabrics", "engines", "model_dirs", "nvlink", "subnet_managers", "installs")


class Nodes:
    def __init__(self, ctx: LoopContext, recorder: Recorder) -> None:
        self._ctx, self._recorder = ctx, recorder
        self.started_at = ctx.clock()
        self.views: dict[str, NodeView] = {}
        #: Nodes already said NotReady (past their grace) or fully drained.
        self.lost: set[str] = set()
        self.drained: set[str] = set()

    def take(self, loaded: Loaded) -> None:
        """Starts from the store's picture, as at a start: every node known but not heard from yet."""
        self.started_at = self._ctx.clock()
        self.views, self.lost, self.drained = {}, set(), set()
        for stored in loaded.nodes:
            # Known but not heard from since this start (or this takeover): disconnected since now, so
            # its replicas get the full grace period to be reported. This is what makes a failover cost
            # no engine restart: nothing is decided about a node's shards until it registered or its
            # grace passed, and its Register lists the shards it still runs.
            self.views[stored.id] = NodeView(stored.id, stored.inventory, connected=False,
                                             disconnected_since=self.started_at, mgmt_addr=stored.mgmt_addr,
                                             cordoned=stored.cordoned, draining=stored.draining,
                                             agent_version=stored.agent_version)

    # -- what agents report --------------------------------------------------------------------
    def registered(self, node: StoredNode, shards: list[ShardStatus]) -> None:
        now = self._ctx.clock()
        # Cordon and drain are the operator's, not the agent's: a registration keeps them.
        prev = self.views.get(node.id)
        view = self.views[node.id] = NodeView(
            node.id, node.inventory, connected=True, mgmt_addr=node.mgmt_addr, shards={s.shard_id: s for s in shards},
            reported=True, registered_at=now, cordoned=bool(prev and prev.cordoned),
            draining=bool(prev and prev.draining), labels=dict(node.labels), agent_version=node.agent_version)
        # A reconnect does not restart the grace of a shard already known Unhealthy.
        since = prev.unhealthy_since if prev is not None else {}
        for st in shards:
            self._stamp_unhealthy(view, st, since=since.get(st.shard_id))
        self._ctx.write(Store.upsert_node, node)
        self.lost.discard(node.id)
        self._recorder.record(ev.Event(self._ctx.clock(), ev.NORMAL, "NodeRegistered", f"node/{node.id}",
                                       f"registered: {node.inventory.cpu_count} CPUs, {len(node.inventory.gpus)} "
                                       f"GPUs, {len(shards)} shards running", node=node.id))
        log.info("node %s registered: %d CPUs, %d GPUs, engines %s, %d shards running", node.id,
                 node.inventory.cpu_count, len(node.inventory.gpus),
                 ",".join(n for n, _ in node.inventory.engines) or "none", len(shards))
        was = prev.agent_version if prev is not None else ""
        if was and node.agent_version and was != node.agent_version:
            # An upgrade (or a rollback) of the node's agent: said once, when it registers at the new version.
            self._recorder.record(ev.Event(self._ctx.clock(), ev.NORMAL, "AgentVersionChanged", f"node/{node.id}",
                                           f"agent {was} → {node.agent_version}", node=node.id))
            log.info("node %s: agent %s -> %s", node.id, was, node.agent_version)

    def heartbeat(self, view: NodeView, hb: Heartbeat) -> bool:
        """Applies a heartbeat to its node's view; True when its installs changed (placement may change)."""
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
        for name in _CHANGED_ONLY:
            value = getattr(hb, name)
            if value is not None:
                changes[name] = value
        # Rebound in place, each a whole new value: the one change a view takes without being
        # replaced (see the module docstring). A new view per beat would cost every heartbeat ~10 us more.
        view.inventory = dataclasses.replace(inv, **changes)  # type: ignore[arg-type]
        view.shard_load = {s.shard_id: s for s in hb.shard_load}
        if hb.installs is None or hb.installs == inv.installs:
            return False
        for e in provisioning.install_events(view.id, inv.installs, hb.installs, now=self._ctx.clock()):
            self._recorder.record(e)
        return True

    def shard_reported(self, node_id: str, status: ShardStatus) -> bool:
        """Applies a shard's status to its node's view; False when the node is not known."""
        view = self.views.get(node_id)
        if view is None:
            return False
        # A new view, not the old one changed: a pass in its thread may be reading the old one,
        # and a dict that grows under its iteration raises there.
        before = view.shards.get(status.shard_id)
        view = self.views[node_id] = dataclasses.replace(
            view, shards={**view.shards, status.shard_id: status}, unhealthy_since=dict(view.unhealthy_since))
        self._stamp_unhealthy(view, status)
        # A fetch's progress comes once a second for as long as the download lasts (hours, for a
        # big model): only its first report and its changes of state are worth a line at INFO.
        again = before is not None and before.state is status.state is ShardState.FETCHING and \
            (before.fetch.state if before.fetch else "") == (status.fetch.state if status.fetch else "")
        log.log(logging.DEBUG if again else logging.INFO, "node %s shard %s %s%s", node_id, status.shard_id,
                status.state.value, f": {status.message}" if status.message else "")
        return True

    def _stamp_unhealthy(self, view: NodeView, status: ShardStatus, *, since: float | None = None) -> None:
        """Notes when a shard was first said Unhealthy (its grace starts there); forgets it once it is not."""
        if status.state is ShardState.UNHEALTHY:
            view.unhealthy_since.setdefault(status.shard_id, since if since is not None else self._ctx.clock())
        else:
            view.unhealthy_since.pop(status.shard_id, None)

    def leaving(self, node_id: str, reason: str) -> bool:
        """The node's agent is stopping (its Goodbye): nothing is placed there until it registers again.

        False when the node is not known or already leaving."""
        view = self.views.get(node_id)
        if view is None or view.leaving:
            return False
        self.views[node_id] = dataclasses.replace(view, leaving=reason[:200] or "its agent is stopping")
        log.info("node %s is leaving: %s", node_id, reason)
        self._recorder.record(ev.Event(self._ctx.clock(), ev.NORMAL, "NodeLeaving", f"node/{node_id}",
                                       f"its agent is stopping ({reason[:200]}); nothing new is placed on it until "
                                       "it registers again", node=node_id))
        return True

    def disconnected(self, node_id: str) -> None:
        """The node's stream ended: its replicas stay for the grace period, then are placed elsewhere."""
        view = self.views.get(node_id)
        if view is not None:
            view = self.views[node_id] = dataclasses.replace(view, connected=False,
                                                             disconnected_since=self._ctx.clock())
            self._ctx.write(Store.touch_nodes, {node_id: view.disconnected_since})
        log.warning("node %s disconnected", node_id)
        self._recorder.record(ev.Event(self._ctx.clock(), ev.WARNING, "NodeDisconnected", f"node/{node_id}",
                                       f"its stream ended; its replicas stay for {self._ctx.cfg.node_grace_s:.0f}s "
                                       "before they are placed elsewhere", node=node_id))

    # -- cordon, uncordon, drain ---------------------------------------------------------------
    def set_scheduling(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        """Persists then applies a node's marks; False when the node is not known."""
        if node_id not in self.views or not self._ctx.store.set_node_scheduling(node_id, cordoned=cordoned,
                                                                                draining=draining):
            return False
        self._marked(node_id, cordoned=cordoned, draining=draining)
        return True

    async def mark(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        """``set_scheduling``, the write awaited on the store's thread."""
        db = self._ctx.db
        if db is None:
            return self.set_scheduling(node_id, cordoned=cordoned, draining=draining)
        if node_id not in self.views or not await db.set_node_scheduling(node_id, cordoned=cordoned,
                                                                         draining=draining):
            return False
        self._marked(node_id, cordoned=cordoned, draining=draining)
        return True

    def _marked(self, node_id: str, *, cordoned: bool, draining: bool) -> None:
        """Applies marks already stored: a new view (see the module docstring), an event record, another pass."""
        self.views[node_id] = dataclasses.replace(self.views[node_id], cordoned=cordoned, draining=draining)
        self.drained.discard(node_id)
        if draining:
            reason, msg = "NodeDraining", ("draining: its replicas move to other nodes, each once its "
                                           "replacement is Ready")
        elif cordoned:
            reason, msg = "NodeCordoned", "cordoned: no new replica is placed here"
        else:
            reason, msg = "NodeUncordoned", "uncordoned: replicas may be placed here again"
        self._recorder.record(ev.Event(self._ctx.clock(), ev.NORMAL, reason, f"node/{node_id}", msg, node=node_id))
        self._recorder.flush()
        self._ctx.kick()

    # -- one pass ------------------------------------------------------------------------------
    def update(self, now: float) -> None:
        """Says NotReady, once, of each node silent past its grace (its replicas are placed elsewhere)."""
        grace = self._ctx.cfg.node_grace_s
        for node in self.views.values():
            if not node.connected and node.id not in self.lost and now - node.disconnected_since > grace:
                self.lost.add(node.id)
                self._recorder.record(ev.Event(now, ev.WARNING, "NodeNotReady", f"node/{node.id}",
                                               f"silent for {now - node.disconnected_since:.0f}s, past its "
                                               f"{grace:.0f}s grace; its replicas are placed elsewhere",
                                               node=node.id))

    def apply(self, plan: Plan) -> None:
        """On the loop: the draining nodes the pass left empty are told drained, once."""
        for node_id in plan.drained:
            view = self.views.get(node_id)
            if view is not None and view.draining:  # not uncordoned while the pass ran
                self.drained.add(node_id)
                self._recorder.record(ev.Event(plan.now, ev.NORMAL, "NodeDrained", f"node/{node_id}",
                                               "every replica has moved off; it stays cordoned until `llmgw "
                                               "uncordon`", node=node_id))
