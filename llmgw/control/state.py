"""The control plane's view of the world, as plain data for the pure decision code.

``ReplicaRecord`` is the persisted target of one replica (the store converts
rows to and from it); ``NodeView`` is what a node last reported, held in memory.
Nothing here does I/O, so placement and reconciliation are tested with these
objects alone.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from llmgw.core.inventory import Inventory, ShardLoad
from llmgw.core.shards import ShardStatus


class Phase(enum.Enum):
    """Where a replica stands in the control plane's plan."""

    #: Not on any node: waiting to be placed (or waiting out a failure's backoff).
    PENDING = "Pending"
    #: StartShard was sent to its node; the engine is not serving yet.
    STARTING = "Starting"
    #: Its engine answers: the router may send it traffic.
    READY = "Ready"
    #: Being stopped (deleted, scaled down or replaced); gone once its shard is.
    TERMINATING = "Terminating"
    #: It served, and its engine's health probe now fails (its agent reports probe failures, or
    #: the shard Unhealthy): the router sends it nothing; Ready again if a probe passes, replaced
    #: once its agent has called it Unhealthy for longer than ``unhealthy_grace_s``.
    UNHEALTHY = "Unhealthy"

    @classmethod
    def placed(cls) -> frozenset[Phase]:
        """Phases in which a replica holds a node's resources."""
        return frozenset({cls.STARTING, cls.READY, cls.TERMINATING, cls.UNHEALTHY})


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """One rank of a replica that spans nodes: its shard on its node, and what placement gave it there."""

    rank: int
    node_id: str
    shard_id: str
    gpus: tuple[int, ...] = ()
    #: The fabric's adapters on its node (NCCL_IB_HCA).
    hcas: tuple[str, ...] = ()


@dataclasses.dataclass(slots=True)
class ReplicaRecord:
    id: str
    model: str
    fingerprint: str
    phase: Phase
    api_key: str
    node_id: str | None = None
    shard_id: str | None = None
    attempt: int = 0
    failures: int = 0
    next_attempt_at: float = 0.0
    started_at: float = 0.0
    sent_at: float = 0.0
    ready_at: float = 0.0
    endpoint: str = ""
    message: str = ""
    last_output: tuple[str, ...] = ()
    created_at: float = 0.0
    #: GPU indices placement gave it on its node; never given to another replica while it holds them.
    gpus: tuple[int, ...] = ()
    #: Memory it was placed with: host memory for a CPU replica, per GPU for a GPU one (0: none stated).
    memory_bytes: int = 0
    #: True when memory_bytes was estimated from the weights' metadata rather than stated.
    memory_estimated: bool = False
    #: The ranks of a replica that spans nodes, rank 0 (the leader) first; empty for a one-node
    #: replica. node_id, shard_id and gpus are then the leader's, so whatever reads one endpoint
    #: per replica (the router's table, `llmgw get replicas`) needs to know nothing of groups.
    members: tuple[Member, ...] = ()
    #: The leader's management address and the rendezvous port every rank was given.
    leader_addr: str = ""
    leader_port: int = 0


@dataclasses.dataclass(slots=True)
class NodeView:
    """A node as last heard from."""

    id: str
    inventory: Inventory
    connected: bool
    #: When the stream ended (or, for a node not seen since this control plane
    #: started, when it started); meaningless while connected.
    disconnected_since: float = 0.0
    mgmt_addr: str = ""
    #: Every shard the agent reported, by shard id, terminal ones included.
    shards: dict[str, ShardStatus] = dataclasses.field(default_factory=dict)
    #: True once this node registered with this control plane instance, so its
    #: shard list is complete. Until then nothing is decided from absence.
    reported: bool = False
    #: When its current stream registered; a command sent before then may
    #: have gone down with the old stream.
    registered_at: float = 0.0
    #: CPU cores and RSS of each shard, from the last heartbeat.
    shard_load: dict[str, ShardLoad] = dataclasses.field(default_factory=dict)
    #: Set by `llmgw cordon` (persisted): no new replica is placed here.
    cordoned: bool = False
    #: Free-form facts from the agent's settings (``labels``), for a model's node_selector and pool.
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Set by `llmgw drain` (persisted, with cordoned): its replicas are rolled to other nodes.
    draining: bool = False
    #: Why its agent said goodbye ("": it has not): it is stopping, so nothing is placed here until the
    #: node registers again (a shard it stops on the way out is replaced on another node, never here).
    leaving: str = ""
    #: When this control plane first heard each shard reported Unhealthy (by shard id), until it
    #: reports Ready again: where an Unhealthy shard's grace starts. Held in memory, like the
    #: shard states: after a restart the grace starts again, rather than replacing an engine on
    #: an old observation.
    unhealthy_since: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The llmgw version its agent said in its last Register (the store's, until it registers with this control
    #: plane): a registration at another one is an upgrade (or a rollback), recorded as an event.
    agent_version: str = ""
