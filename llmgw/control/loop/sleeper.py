"""The idle manager (issue 31, part 3): puts the ready replicas of a model with ``spec.idle`` to sleep after
its idle window, and wakes them when a router holds a request for the model.

It decides with ``core.idle.idle_step`` on what the control plane already has: the routers' load per
model (``loadreports``, the autoscaler's input: the newest request, requests waiting or held, in flight)
and each replica's shard as its agent reports it (``ShardStatus.sleep_level``). The agent acts
(``SleepShard``: the engine's own ``/sleep`` and ``/wake_up``); a router never calls an engine's admin API.

Which replicas sleep is kept in the store's ``settings`` key/value table (``KEY``: replica id -> level, JSON),
so the routers' table, built from the store by any control plane (a standby too), leaves them out of a
model's endpoints; with none left the model is held as a model at zero is (``router/cold.py``), the
router reports the held request, and the next pass wakes a replica. No new table or column: the release
before reads that table by the keys it knows.

A command is sent once and again only after ``RESEND_S`` (the agent's report is what moves the state).
An engine that cannot sleep is not stopped here: a model at zero is the autoscaler's (``min_replicas: 0``
with ``scale_to_zero_after``), and the step's sentence is logged once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

from llmgw.control import events as ev
from llmgw.control.loadreports import RouterSignals
from llmgw.control.loop.context import LoopContext
from llmgw.control.loop.links import Links
from llmgw.control.placement import overcommit
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.store.store import Store
from llmgw.core import idle, specs

log = logging.getLogger(__name__)

#: The ``settings`` row listing the sleeping replicas: ``{"replica id": level}``.
KEY = "idle_sleeping"
#: How long a sleep or wake command waits for its agent's report before it is sent again.
RESEND_S = 30.0


def sleeping_from(settings: Mapping[str, str]) -> dict[str, int]:
    """The sleeping replicas as the store keeps them; a row that does not read is none (every replica routed)."""
    try:
        doc = json.loads(settings.get(KEY, "") or "{}")
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): int(v) for k, v in doc.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


class Sleeper:
    def __init__(self, ctx: LoopContext, links: Links, signals: RouterSignals,
                 views: Callable[[], Mapping[str, NodeView]], record: Callable[[ev.Event], None]) -> None:
        self._ctx, self._links, self._signals, self._views, self._record = ctx, links, signals, views, record
        #: replica id -> (level asked, when), until its agent reports that level.
        self._asked: dict[str, tuple[int, float]] = {}
        #: replica id -> when it last woke (its idle window restarts there).
        self._woke: dict[str, float] = {}
        #: What the store's row says now (None: not read since this one took the lease).
        self._written: dict[str, int] | None = None
        self._told: set[str] = set()
        #: The pass being stepped: models, replicas, the sleeping set, its time.
        self._pass: tuple[Mapping[str, specs.ModelSpec], list[ReplicaRecord], dict[str, int], float] = ({}, [], {}, 0.0)

    def take(self, settings: Mapping[str, str]) -> None:
        self._written = sleeping_from(settings)
        self._asked, self._woke, self._told = {}, {}, set()

    def step(self, models: Mapping[str, specs.ModelSpec], replicas: list[ReplicaRecord], now: float) -> None:
        """One pass: each idle step's command sent, then the sleeping set written when it changed.

        The set written holds the replicas asked to sleep as well as those asleep: the routers' table leaves a
        replica out before its engine sleeps (it sleeps with ``mode=wait``, so what reached it finishes), and a
        waking one until its agent reports it awake, when the held requests go to it.
        """
        views = self._views()
        sleeping: dict[str, int] = {}
        for r in replicas:
            level = self._level(r, views)
            if level:
                sleeping[r.id] = level
        if self._ctx.leading and self._ctx.may_act():
            self._pass = (models, replicas, sleeping, now)
            for r in replicas:
                spec = models.get(r.model)
                if spec is None or spec.idle is None or r.phase is not Phase.READY or not r.node_id or not r.shard_id:
                    continue
                self._step_one(spec.idle, spec.engine, r, sleeping.get(r.id, 0), now)
        live = {r.id for r in replicas}
        written = dict(sleeping)
        for rid, (level, _) in self._asked.items():
            if level and rid in live:
                written.setdefault(rid, level)
        if written != self._written:
            self._ctx.write(Store.put_settings, {KEY: json.dumps(written, sort_keys=True)})
            self._written = written

    def _level(self, r: ReplicaRecord, views: Mapping[str, NodeView]) -> int:
        if r.phase is not Phase.READY or not r.node_id or not r.shard_id:
            return 0
        view = views.get(r.node_id)
        status = view.shards.get(r.shard_id) if view is not None else None
        if status is None:  # not heard from since this one leads: as the store says
            return (self._written or {}).get(r.id, 0)
        return status.sleep_level

    def _step_one(self, spec: idle.Idle, engine: str, r: ReplicaRecord, level: int, now: float) -> None:
        asked = self._asked.get(r.id)
        if asked is not None and asked[0] == level:
            del self._asked[r.id]  # its agent reported what was asked
            if level == 0:
                self._woke[r.id] = now
            asked = None
        sig = self._signals.signals(r.model, now)
        wanted = sig is not None and (sig.wanted or sig.waiting > 0)
        busy = sig is not None and sig.in_flight > 0
        replica = idle.Replica(id=r.id, state=idle.SLEEPING if level else idle.AWAKE,
                               can_sleep=idle.can_sleep(engine, r.gpus) and not self._refused(r),
                               last_request_at=sig.last_request_at if sig is not None else 0.0,
                               awake_since=max(r.ready_at, self._woke.get(r.id, 0.0)))
        step = idle.idle_step(spec, replica, now=now, wanted=wanted, busy=busy)
        if step is None:
            return
        if step.verb == "stop":
            if r.id not in self._told:
                self._told.add(r.id)
                log.info("replica %s: %s (scale it to zero with spec.autoscale min_replicas: 0)", r.id, step.reason)
            return
        target = step.level if step.verb == "sleep" else 0
        if target == 0 and not self._room_to_wake(r, now):
            return
        if asked is not None and asked[0] == target and now - asked[1] < RESEND_S:
            return
        self._send(r, target, asked, now, step.reason)

    def _send(self, r: ReplicaRecord, target: int, asked: tuple[int, float] | None, now: float, why: str) -> None:
        self._asked[r.id] = (target, now)
        shard_id = r.shard_id
        assert shard_id is not None and r.node_id is not None
        self._links.send(r.node_id, lambda link: link.sleep_shard(shard_id, level=target))
        if asked is not None and asked[0] == target:
            return  # asked again: told once (a refusal is its replica's message)
        reason = "Sleeping" if target else "Waking"
        self._record(ev.Event(now, ev.NORMAL, reason, f"replica/{r.id}", f"replica {r.id}: {why}",
                              model=r.model, node=r.node_id))


    def _room_to_wake(self, r: ReplicaRecord, now: float) -> bool:
        """Whether ``r`` may wake now: alone on its GPUs, or the awake replicas sharing them (over-commit) leave
        it room. Where they do not, the least recently used idle ones are put to sleep first (``wake_plan``) and
        the wake waits for their agents' reports; while the others serve, it waits."""
        models, replicas, sleeping, _ = self._pass
        if not r.gpus or not r.node_id:
            return True
        views = self._views()
        shared = overcommit.residents(replicas, views)
        others = {x.id: x for g in r.gpus for x, _ in shared.get((r.node_id, g), []) if x.id != r.id}
        if not others:
            return True
        total = overcommit.gpu_total(views.get(r.node_id), r.gpus[0])
        if not total:
            return True
        residents = [self._resident(r, total, sleeping, models, now)]
        residents += [self._resident(x, total, sleeping, models, now) for x in others.values()]
        plan = idle.wake_plan(total, residents, r.id)
        if not plan.wake:
            if r.id + ":wait" not in self._told:
                self._told.add(r.id + ":wait")
                log.info("replica %s waits to wake: %s", r.id, plan.reason)
            return False
        for rid in plan.sleep:
            x = others[rid]
            spec = models.get(x.model)
            level = spec.idle.level if spec is not None and spec.idle is not None else 1
            asked = self._asked.get(rid)
            if asked is None or asked[0] != level or now - asked[1] >= RESEND_S:
                self._send(x, level, asked, now, f"to wake {r.id} ({r.model}): {plan.reason}")
        return not plan.sleep

    def _resident(self, x: ReplicaRecord, total: int, sleeping: Mapping[str, int],
                  models: Mapping[str, specs.ModelSpec], now: float) -> idle.Resident:
        sig = self._signals.signals(x.model, now)
        spec = models.get(x.model)
        # Only a replica of a model with spec.idle on an engine that sleeps can be put to sleep for another.
        sleeps = spec is not None and spec.idle is not None and idle.can_sleep(spec.engine, x.gpus)
        busy = not sleeps or (sig is not None and (sig.in_flight > 0 or sig.waiting > 0))
        return idle.Resident(id=x.id, model=x.model, memory_mib=x.memory_bytes or total,
                             awake=not sleeping.get(x.id), last_used=sig.last_request_at if sig is not None else 0.0,
                             busy=busy)

    def _refused(self, r: ReplicaRecord) -> bool:
        """Its agent said its engine cannot sleep (started without its sleep mode): it is not asked again."""
        view = self._views().get(r.node_id or "")
        status = view.shards.get(r.shard_id or "") if view is not None else None
        return status is not None and status.sleep_level == 0 and "without its sleep mode" in status.message
