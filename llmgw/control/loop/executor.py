"""The executor: a pass's effects, in their one safe order: the targets written to the store, then the
commands sent to the agents.

A command goes out only after the targets that explain it are stored, and only while this control plane
still knows it leads (a lease that lapsed while the pass ran keeps its commands home). Engine Provisions
are sent where they changed since the last one on the node's stream; RemoveWeights are remembered until
the node stops listing the weights, so one lost with a dropped stream is asked again later.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from llmgw.control.loop.context import LoopContext
from llmgw.control.loop.links import Links
from llmgw.control.loop.plan import Plan
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView
from llmgw.control.store.store import Store
from llmgw.core.provision import Provision

log = logging.getLogger(__name__)
#: How long a RemoveWeights its node still lists waits before it is asked again: the agent's
#: next weights rescan shows the removal, and one lost with a dropped stream is not lost for good.
REMOVE_RESEND_S = 600.0


def write_targets(store: Store, plan: Plan) -> None:
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


class Executor:
    def __init__(self, ctx: LoopContext, links: Links, *, views: Callable[[], Mapping[str, NodeView]],
                 provisioning_inputs: Callable[[], tuple[object, object]]) -> None:
        self._ctx, self._links = ctx, links
        #: The nodes' views now, and the engine wants and settings now (``Plan.provisioned_from``).
        self._views, self._inputs = views, provisioning_inputs
        #: (node, cache name) -> when RemoveWeights was sent, until the node stops listing it.
        self._removing: dict[tuple[str, str], float] = {}

    def take(self) -> None:
        self._removing = {}

    def still_removing(self, now: float) -> frozenset[tuple[str, str]]:
        """RemoveWeights sent that their nodes still list; asked again once ``REMOVE_RESEND_S`` has passed."""
        views = self._views()
        for key, sent in list(self._removing.items()):
            view = views.get(key[0])
            listed = view is not None and any(w.cache_name == key[1] for w in view.inventory.weights)
            if not listed or now - sent > REMOVE_RESEND_S:
                del self._removing[key]
        return frozenset(self._removing)

    def apply(self, plan: Plan) -> None:
        """On the loop, once the targets are written: the pass's commands and changed Provisions, sent."""
        if not (self._ctx.leading and self._ctx.may_act()):
            # The lease may have lapsed while the pass ran: its targets were written under the fence, but
            # commands go out only while this control plane still knows it leads.
            log.warning("not sending the pass's commands: this control plane's lease is not fresh")
            return
        send = self._links.send
        for dec in plan.decisions:  # only after the targets are written
            if isinstance(dec, d.StartShard):
                send(dec.node_id, lambda link, dec=dec: link.start_shard(dec.spec))
            elif isinstance(dec, d.DrainShard):
                send(dec.node_id, lambda link, dec=dec: link.drain_shard(dec.shard_id, timeout_s=dec.timeout_s))
            elif isinstance(dec, d.StopShard):
                send(dec.node_id, lambda link, dec=dec: link.stop_shard(dec.shard_id, reason=dec.reason))
            elif isinstance(dec, d.RemoveWeights):
                self._removing[(dec.node_id, dec.cache_name)] = plan.now
                send(dec.node_id, lambda link, dec=dec: link.remove_weights(dec.cache_name))
        # Worked out before a want changed: sending them could undo an `engine remove` made while the pass
        # ran (its removal sent, then the old want again); the change kicked a pass that sends the new ones.
        if plan.provisioned_from != self._inputs():
            return
        views, provisioned = self._views(), self._links.provisioned
        for node_id, prov in plan.provisions.items():
            last, view = provisioned.get(node_id), views.get(node_id)
            if last is None and not prov.wants and (view is None or not view.inventory.installs):
                continue  # nothing wanted, nothing installed: an empty Provision would say nothing new
            if self._links.connected(node_id) and last != prov:
                provisioned[node_id] = prov
                send(node_id, lambda link, prov=prov: link.provision(prov))

    def send_engine_removal(self, node_id: str, remove: Provision) -> bool:
        """Sends a one-off Provision carrying ``remove`` to a connected node; False when it is not connected."""
        if not self._links.connected(node_id):
            return False
        # Its wants are the node's whole set as of now: the next pass sends nothing new unless they change.
        self._links.provisioned[node_id] = dataclasses.replace(remove, remove=())
        self._links.send(node_id, lambda link: link.provision(remove))
        return True
