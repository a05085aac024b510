"""Autoscaling (issue 17): each autoscaled model's replica count, decided every pass from the routers' load
reports, written before the replicas it asks for.

The decision itself is ``core.autoscale.decide`` (pure); this manager holds each model's state as last
written, feeds it the routers' merged load (``control.loadreports.RouterSignals``), and hands the pass the
models with their counts in force (``in_force``): everything that counts replicas reads those, never the
bare spec, whose ``replicas`` is only the floor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control import loadreports
from llmgw.control.loop.plan import Loaded, Plan
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.store.store import StoredAutoscale
from llmgw.core import autoscale, idle, specs


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


class Autoscaling:
    def __init__(self, signals: loadreports.RouterSignals, *, kick: Callable[[], None]) -> None:
        #: What routers report of each model's load: the autoscaler's input. A report that holds a request
        #: for a model at zero kicks a pass at once, so its replica starts without waiting a tick.
        self.signals = signals
        self.signals.on_wake = self._woken
        self._kick = kick
        #: Each autoscaled model's autoscaler state as last written (loaded when this control plane leads).
        self.states: dict[str, StoredAutoscale] = {}

    def take(self, loaded: Loaded) -> None:
        self.states = dict(loaded.autoscale)

    def _woken(self, model: str) -> None:
        """A router holds a request for ``model`` (at zero): a pass now, so its replica starts without a tick's wait."""
        self._kick()

    def observed_load(self, models: Mapping[str, specs.ModelSpec], now: float
                      ) -> tuple[dict[str, autoscale.Signals | None], dict[str, float]]:
        """The routers' merged signals of each autoscaled model, and the in-flight count of every replica.

        Read on the loop, where reports are recorded: ``RouterSignals`` is not for two threads at once.
        """
        return ({name: self.signals.signals(name, now) for name, spec in models.items() if spec.autoscale is not None},
                self.signals.load())

    def autoscaled(self, name: str) -> StoredAutoscale | None:
        """A model's autoscaler state as this leader last wrote it (None: not autoscaled, or not leading)."""
        return self.states.get(name)

    def decide(self, plan: Plan, models: dict[str, specs.ModelSpec], replicas: list[ReplicaRecord],
               signals: Mapping[str, autoscale.Signals | None]) -> dict[str, specs.ModelSpec]:
        """Decides each autoscaled model's count (into ``plan``); returns the models with their counts in force.

        Pure over its arguments and ``self.states`` (changed only by ``apply``, on the loop): safe in a thread.
        """
        by_model: dict[str, list[ReplicaRecord]] = {}
        for r in replicas:
            by_model.setdefault(r.model, []).append(r)
        states: dict[str, StoredAutoscale] = {}
        for name, spec in models.items():
            if spec.autoscale is not None:
                states[name] = self._decide_one(plan, name, spec, spec.autoscale, by_model.get(name, []),
                                                signals.get(name))
        plan.autoscale_gone = [name for name in self.states if name not in states]
        return in_force(models, states)

    def _decide_one(self, plan: Plan, name: str, spec: specs.ModelSpec, auto: autoscale.Autoscale,
                    mine: list[ReplicaRecord], signals: autoscale.Signals | None) -> StoredAutoscale:
        fp, now = spec.fingerprint(), plan.now
        prev = self.states.get(name)
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
        # spec.idle (issue 31): where an idle replica is to be stopped, not put to sleep, that is scaling to zero.
        auto = idle.zero_window(auto, spec.idle, engine=spec.engine, on_gpus=spec.resources.gpus.count > 0)
        # A replica of this model refused a node (not one waiting out a failure's backoff): asking for
        # more would only queue more that cannot be placed, a pass after pass loop.
        unplaceable = next((r.message for r in mine if r.phase is Phase.PENDING and r.message
                            and not r.failures and r.fingerprint == fp), "")
        out = autoscale.decide(auto, signals, start, now=now, rolling=rolling, unplaceable=unplaceable)
        stored = _stored(name, out.state, out.reason or (prev.last_reason if prev is not None else ""))
        if stored != prev:
            plan.autoscale.append(stored)
        if out.reason:
            plan.event_records.append(ev.Event(now, ev.NORMAL, "Autoscaled", f"model/{name}", out.reason, model=name))
        plan.autoscaling[name] = cond.autoscaling(spec, replicas=out.state.replicas, limited=out.limited,
                                                  unplaceable=bool(unplaceable) and out.limited == unplaceable)
        return stored

    def apply(self, plan: Plan) -> None:
        """On the loop, once the pass's states are written: they are the ones in force now."""
        self.states.update({a.model: a for a in plan.autoscale})
        for name in plan.autoscale_gone:
            self.states.pop(name, None)
