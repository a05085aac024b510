"""The planner: the part of a pass that decides, pure over what it is handed, so it may run off the loop.

On the loop it gathers what the pass decides on besides the targets and the nodes (``observe``: the routers'
load and ejections, remote sources' metadata, RemoveWeights in flight). Then, in a worker thread in the
server, it asks each manager's pure part in order (``plan``): autoscaling's counts, the decision
(``reconcile.decide.reconcile``), the recorder's event records and conditions, each node's Provision.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping

from llmgw.control import remotemeta
from llmgw.control.loop.autoscaling import Autoscaling
from llmgw.control.loop.context import LoopContext
from llmgw.control.loop.executor import Executor
from llmgw.control.loop.plan import Plan, add_targets
from llmgw.control.loop.recorder import Recorder
from llmgw.control.placement import fit
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.state import NodeView, ReplicaRecord
from llmgw.core import autoscale, specs


@dataclasses.dataclass(frozen=True, slots=True)
class Observed:
    """What a pass decides on besides the targets and the nodes, read on the loop."""

    #: The replicas routers have ejected now, with their sentence (from the routers' reports).
    ejected: dict[str, str]
    #: Remote sources' metadata read so far (None: placed without it).
    remote: Mapping[str, fit.RemoteWeights] | None = None
    #: RemoveWeights sent that their nodes still list.
    removing: frozenset[tuple[str, str]] = frozenset()
    #: The routers' merged load signals of each autoscaled model, and each replica's in-flight count.
    signals: Mapping[str, autoscale.Signals | None] = dataclasses.field(default_factory=dict)
    load: Mapping[str, float] | None = None


class Planner:
    def __init__(self, ctx: LoopContext, *, autoscaling: Autoscaling, recorder: Recorder, executor: Executor,
                 ejections: Callable[[], dict[str, str]], remote_meta: remotemeta.Reader | None,
                 provisioning_inputs: Callable[[], tuple[tuple[provisioning.ScopedWant, ...],
                                                         provisioning.EngineSettings]]) -> None:
        self._ctx, self._autoscaling, self._recorder, self._executor = ctx, autoscaling, recorder, executor
        self._ejections, self._remote_meta, self._inputs = ejections, remote_meta, provisioning_inputs

    def observe(self, models: dict[str, specs.ModelSpec], now: float) -> Observed:
        """On the loop, where routers' reports are recorded (``RouterSignals`` is not for two threads at once)."""
        signals, load = self._autoscaling.observed_load(models, now)
        return Observed(ejected=self._ejections(), remote=self._remote(models),
                        removing=self._executor.still_removing(now), signals=signals, load=load)

    def _remote(self, models: dict[str, specs.ModelSpec]) -> dict[str, fit.RemoteWeights] | None:
        """Remote sources' metadata read so far; reads of the ones not read yet start now (off the loop)."""
        if self._remote_meta is None:
            return None
        with contextlib.suppress(RuntimeError):  # no running loop: reconcile_once in a unit test
            self._remote_meta.want(models.values())
        return self._remote_meta.known()

    def plan(self, models: dict[str, specs.ModelSpec], replicas: list[ReplicaRecord],
             nodes: Mapping[str, NodeView], drained: frozenset[str], *, now: float, seen: Observed) -> Plan:
        """The managers' pure parts, in order: autoscaling, the decision, the recorder, the Provisions.

        Pure over its arguments and what the managers held after the last pass was applied (changed only
        then, on the loop): safe in a thread.
        """
        plan = Plan(decisions=[], now=now)
        models = self._autoscaling.decide(plan, models, replicas, seen.signals)
        add_targets(plan, decide.reconcile(models, replicas, nodes, now=now, cfg=self._ctx.cfg, ejected=seen.ejected,
                                           remote=seen.remote, removing=seen.removing, load=seen.load))
        self._recorder.derive(plan, models, replicas, nodes, drained)
        wants, settings = self._inputs()
        plan.provisioned_from = (wants, settings)
        plan.provisions = provisioning.provisions((n for n in nodes.values() if n.connected), wants, models, settings)
        return plan
