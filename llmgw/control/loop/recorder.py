"""The recorder: event records (``control.events``: what ``llmgw events`` and ``describe`` list) and the
conditions of replicas and models, each worked out from a pass and written to the store.

"Event" here is always such a record, never a router's report (``control.routerreports``) nor an asyncio
event. Records queue until ``flush`` (a registration storm costs one write a pass, not one a node), and an
object's record that repeats its last one is dropped, so a command resent every pass is told once.
Conditions are kept as last written (their transition times survive a restart: they are loaded when this
control plane starts leading), and only the ones that changed are written.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control.loop.context import LoopContext
from llmgw.control.loop.plan import Loaded, Plan
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView, ReplicaRecord
from llmgw.control.store.store import Store
from llmgw.core import specs


class Recorder:
    def __init__(self, ctx: LoopContext) -> None:
        self._ctx = ctx
        #: Event records not yet written.
        self._unwritten: list[ev.Event] = []
        #: (reason, message) of each object's last record, so a repeat is not written again.
        self._last: dict[str, tuple[str, str]] = {}
        #: Conditions as last written, by "replica/ID" and "model/NAME".
        self.conds: dict[str, tuple[cond.Condition, ...]] = {}

    def take(self, loaded: Loaded) -> None:
        """Starts from the store's conditions, with nothing recorded yet."""
        self.conds, self._last = {}, {}
        self.conds.update({f"replica/{k}": v for k, v in loaded.replica_conds.items()})
        self.conds.update({f"model/{k}": v for k, v in loaded.model_conds.items()})

    def drop_unwritten(self) -> None:
        """Forgets the records not written yet (leadership changed: they are no longer this one's to write)."""
        self._unwritten = []

    def record(self, event: ev.Event) -> None:
        """Queues an event record for the next write, unless it repeats the object's last one."""
        key = (event.reason, event.message)
        if not self._ctx.leading or self._last.get(event.object) == key:
            return
        self._last[event.object] = key
        self._unwritten.append(event)

    def flush(self) -> None:
        if self._unwritten:
            batch, self._unwritten = self._unwritten, []
            self._ctx.write(Store.add_events, batch)

    def conditions_of(self, obj: str) -> tuple[cond.Condition, ...]:
        """Conditions of "replica/ID" or "model/NAME" as of the last pass."""
        return self.conds.get(obj, ())

    # -- one pass ----------------------------------------------------------------------------
    def derive(self, plan: Plan, models: dict[str, specs.ModelSpec], before: list[ReplicaRecord],
               nodes: Mapping[str, NodeView], drained: frozenset[str]) -> None:
        """Event records for what the pass changed, then conditions (kept only where they changed), into ``plan``.

        Pure over its arguments and ``self.conds`` (changed only by ``apply``, on the loop): safe in a thread.
        Also lists the draining nodes the pass left without a replica (``plan.drained``).
        """
        now, loop = plan.now, self._ctx.cfg.crash_loop_after
        old = {r.id: r for r in before}
        after = dict(old)
        for r in plan.upserts:
            after[r.id] = r
            plan.event_records.extend(ev.replica_events(old.get(r.id), r, now=now, crash_loop_after=loop))
        for rid in plan.deletes:
            gone = after.pop(rid, None)
            plan.event_records.extend(ev.replica_events(gone, None, now=now, crash_loop_after=loop))
        for dec in plan.decisions:
            if isinstance(dec, d.RecordEvent):
                plan.event_records.append(dec.event)
            if isinstance(dec, d.StopShard) and dec.reason == decide.ORPHAN_REASON:
                plan.event_records.append(ev.Event(now, ev.NORMAL, "OrphanStopped", f"node/{dec.node_id}",
                                                   f"stopping shard {dec.shard_id}: {dec.reason}", node=dec.node_id))
        self._conditions(plan, list(after.values()), models, nodes)
        placed = {n for r in after.values() for n in (r.node_id, *(m.node_id for m in r.members))}
        plan.drained = [node.id for node in nodes.values()
                        if node.draining and node.id not in drained and node.id not in placed]

    def _conditions(self, plan: Plan, replicas: list[ReplicaRecord], models: dict[str, specs.ModelSpec],
                    nodes: Mapping[str, NodeView]) -> None:
        """Each replica's and each model's conditions into ``plan`` where they changed (a model's with a record)."""
        now, loop = plan.now, self._ctx.cfg.crash_loop_after
        by_model: dict[str, list[ReplicaRecord]] = {}
        replica_conds: dict[str, tuple[cond.Condition, ...]] = {}
        for r in replicas:
            by_model.setdefault(r.model, []).append(r)
            key = f"replica/{r.id}"
            prev = self.conds.get(key, ())
            new = cond.carry_times(cond.replica_conditions(r, models.get(r.model), nodes, now=now,
                                                           crash_loop_after=loop), prev, now=now)
            replica_conds[r.id] = new
            if new != prev:
                plan.conds[key] = plan.changed_replicas[r.id] = new
        for name, spec in models.items():
            key = f"model/{name}"
            prev = self.conds.get(key, ())
            extra = (plan.autoscaling[name],) if name in plan.autoscaling else ()
            new = cond.carry_times(cond.model_conditions(spec, by_model.get(name, []), replica_conds, nodes) + extra,
                                   prev, now=now)
            if new != prev:
                plan.event_records.extend(ev.condition_events(key, name, new, prev, now=now))
                plan.conds[key] = plan.changed_models[name] = new
        plan.conds_gone = [k for k in self.conds if k.startswith("model/") and k[6:] not in models]

    def apply(self, plan: Plan) -> None:
        """On the loop: the pass's records queued, its conditions held as written."""
        for e in plan.event_records:
            self.record(e)
        for rid in plan.deletes:
            self.conds.pop(f"replica/{rid}", None)
            self._last.pop(f"replica/{rid}", None)
        self.conds.update(plan.conds)
        for key in plan.conds_gone:
            self.conds.pop(key, None)
