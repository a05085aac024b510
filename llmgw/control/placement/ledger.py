"""What placed replicas hold on each node, counted once per pass.

Counting by scanning every replica for every node for every pending replica
made a pass cubic: 2,000 replicas on 1,000 simulated nodes were not all placed
after four minutes. The reconciler builds one ledger per pass.

A node's free memory is what it last reported, less what the replicas sent to
it but not yet Ready will take: those engines are still loading, so the report
does not show their memory yet. Without that, a burst of replicas all fit on
the node that looked free and then run it out of memory. GPUs are held by
index for as long as a replica is placed, Ready included: the report shows a
Ready engine's memory as used, but a GPU handed to a second replica because
its first one had not allocated yet is the double booking this prevents.

A replica that spans nodes holds each rank's share on that rank's node: its
threads, loading memory and GPUs are counted once per member, where the
member runs, not all on the leader's node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core.specs import ModelSpec


def host_memory(r: ReplicaRecord, spec: ModelSpec) -> int:
    """Host memory a replica takes: stated, or (for a CPU replica) what it was placed with."""
    if spec.resources.memory_bytes:
        return spec.resources.memory_bytes
    return 0 if r.gpus or spec.resources.gpus.count else r.memory_bytes


class Ledger:
    def __init__(self, replicas: Iterable[ReplicaRecord] = (), specs: Mapping[str, ModelSpec] | None = None) -> None:
        self.loading_memory: dict[str, int] = {}
        self.threads: dict[str, int] = {}
        self.per_model: dict[tuple[str, str], int] = {}
        #: node id -> GPU index -> the replica holding it.
        self.gpus: dict[str, dict[int, str]] = {}
        specs = specs or {}
        for r in replicas:
            spec = specs.get(r.model)
            if r.node_id is None or r.phase not in Phase.placed():
                continue
            where = [(m.node_id, m.gpus) for m in r.members] or [(r.node_id, r.gpus)]
            for node_id, gpus in where:
                if spec is None:
                    # Its model is gone but its engine is not stopped yet: its GPUs are still taken.
                    self.hold(node_id, gpus, r.id)
                    continue
                self.add(node_id, r.model, threads=spec.resources.cpu_threads, memory_bytes=host_memory(r, spec),
                         loading=r.phase is Phase.STARTING, gpus=gpus, replica_id=r.id)

    def add(self, node_id: str, model: str, *, threads: int, memory_bytes: int, loading: bool,
            gpus: tuple[int, ...] = (), replica_id: str = "") -> None:
        self.per_model[(node_id, model)] = self.per_model.get((node_id, model), 0) + 1
        if threads:
            self.threads[node_id] = self.threads.get(node_id, 0) + threads
        if loading and memory_bytes:
            self.loading_memory[node_id] = self.loading_memory.get(node_id, 0) + memory_bytes
        self.hold(node_id, gpus, replica_id)

    def hold(self, node_id: str, gpus: tuple[int, ...], replica_id: str) -> None:
        if gpus:
            held = self.gpus.setdefault(node_id, {})
            for i in gpus:
                held.setdefault(i, replica_id)
