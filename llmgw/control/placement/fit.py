"""Placement's front: which node (and GPUs) takes a replica, or why none can (pure).

The parts behind it, each tested with plain data:

* ``needs``: what one replica of a model needs, worked out once per pass;
* ``ledger``: what placed replicas hold (threads, loading memory, GPU indices);
* ``filters``: one check per requirement, each with the reason it gives;
* ``gpus``: which GPUs are free (by the ledger *and* by the node's report) and
  which of them a replica gets (NVLink first, then one PCIe switch);
* ``placer``: the per-pass index that makes a replica a lookup, not a scan;
* ``explain``: the refusal sentence naming the nearest nodes;
* ``group``: nodes, ranks and adapters for a replica that spans nodes.

A pass builds one ``Ledger`` from the replicas already placed and one
``Placer`` over the nodes, then asks it for each pending replica in order.
"""

from __future__ import annotations

from llmgw.control.placement.explain import Refused
from llmgw.control.placement.group import Group, Rank, place_group
from llmgw.control.placement.ledger import Ledger
from llmgw.control.placement.needs import RemoteWeights
from llmgw.control.placement.placer import Estimator, Placed, Placer, place

__all__ = ["Estimator", "Group", "Ledger", "Placed", "Placer", "Rank", "Refused", "RemoteWeights", "place",
           "place_group"]
