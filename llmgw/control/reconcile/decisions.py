"""What the reconciler decides; the control plane's executor carries these out.

Plain values, so a test asserts on exactly what would be done without doing it.
"""

from __future__ import annotations

import dataclasses

from llmgw.control.events import Event
from llmgw.control.state import ReplicaRecord
from llmgw.core.shards import ShardSpec


@dataclasses.dataclass(frozen=True, slots=True)
class CreateReplica:
    """A new Pending replica of ``model``; the executor names it and makes its key."""

    model: str
    fingerprint: str


@dataclasses.dataclass(frozen=True, slots=True)
class UpdateReplica:
    """Persist ``record`` as the replica's new target, before any command for it goes out."""

    record: ReplicaRecord


@dataclasses.dataclass(frozen=True, slots=True)
class DeleteReplica:
    replica_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class StartShard:
    node_id: str
    spec: ShardSpec


@dataclasses.dataclass(frozen=True, slots=True)
class StopShard:
    node_id: str
    shard_id: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class DrainShard:
    """Let in-flight requests finish (at most ``timeout_s``); the agent then reports the shard Drained."""

    node_id: str
    shard_id: str
    timeout_s: int


@dataclasses.dataclass(frozen=True, slots=True)
class RemoveWeights:
    """Remove weights llmgw fetched from a node's weights cache (the agent refuses anything else)."""

    node_id: str
    #: The name in the cache (``WeightFile.cache_name``).
    cache_name: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class RecordEvent:
    """Something seen that changes no target but a person should read (``llmgw events``, describe).

    The executor records it as it records every event: a repeat of an object's last event is
    not written again, so a pass may say the same thing every time it sees it.
    """

    event: Event


Decision = (CreateReplica | UpdateReplica | DeleteReplica | StartShard | StopShard | DrainShard | RemoveWeights
            | RecordEvent)
