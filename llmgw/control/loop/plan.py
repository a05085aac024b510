"""One pass's plan, the data the managers hand each other: decided off the loop, written, then applied.

Also what the loop reads from the store: the targets at the start of a pass (``read_targets``) and the whole
picture when this control plane starts leading (``load``). Plain data and store reads; no effect here.
"""

from __future__ import annotations

import dataclasses
import secrets

from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control.reconcile import decisions as d
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.store.store import Store, StoredAutoscale, StoredNode
from llmgw.core import specs
from llmgw.core.provision import Provision


@dataclasses.dataclass(slots=True)
class Plan:
    """What one pass decided and derived, made off the loop; written, then applied on the loop."""

    decisions: list[d.Decision]
    now: float
    upserts: list[ReplicaRecord] = dataclasses.field(default_factory=list)
    deletes: list[str] = dataclasses.field(default_factory=list)
    #: Another pass should follow at once (replicas were created: place them).
    again: bool = False
    #: Event records (``control.events``), in the order they happened; the recorder drops repeats.
    event_records: list[ev.Event] = dataclasses.field(default_factory=list)
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
    #: The wants and settings they were worked out from: stale once either is rebound (see the executor).
    provisioned_from: tuple[object, object] = (None, None)
    #: Autoscaler states that changed (written before the replicas), and those of models no longer autoscaled.
    autoscale: list[StoredAutoscale] = dataclasses.field(default_factory=list)
    autoscale_gone: list[str] = dataclasses.field(default_factory=list)
    #: Each autoscaled model's ``Autoscaling`` condition, added to its model conditions.
    autoscaling: dict[str, cond.Condition] = dataclasses.field(default_factory=dict)


def add_targets(plan: Plan, decisions: list[d.Decision]) -> None:
    """The replicas' new targets that ``decisions`` ask for, into ``plan`` (a created replica gets its id and key)."""
    plan.decisions = decisions
    for dec in decisions:
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
                phase=Phase.PENDING, api_key=f"sk-{secrets.token_urlsafe(24)}", created_at=plan.now))
            plan.again = True


def read_targets(store: Store) -> tuple[dict[str, specs.ModelSpec], list[ReplicaRecord]]:
    return {m.model.name: m.model.spec for m in store.list_models()}, store.list_replicas()


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """What a control plane reads from the store when it starts leading."""

    nodes: list[StoredNode]
    replica_conds: dict[str, tuple[cond.Condition, ...]]
    model_conds: dict[str, tuple[cond.Condition, ...]]
    wants: tuple[provisioning.ScopedWant, ...]
    settings: dict[str, str]
    autoscale: dict[str, StoredAutoscale] = dataclasses.field(default_factory=dict)


def load(store: Store) -> Loaded:
    replica_conds, model_conds = store.conditions()
    return Loaded(store.list_nodes(), replica_conds, model_conds, tuple(store.list_engine_wants()), store.settings(),
                  store.autoscale_states())
