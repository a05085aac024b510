"""Adapter affinity: each replica's LoRA cache as this router models it, and the replicas an adapter's request
may go to (the decision is ``core.adapteraffinity``'s, pure; this is its state).

Every replica of a base registers every adapter (its agent loads them all), and its engine holds at most
the table's ``adapter_slots`` of them, least recently used evicted, loading one it does not hold on demand
within the request (``core.adapteraffinity`` says why the engine does it). The router sees every request it
sends, so it models each replica's cache with the engine's own rule (``touch``): an adapter's request goes
to a replica that holds it unless that one is busy, else to the least loaded one, which loads it.

Only an adapter's route (``ModelRoute.parent``) comes here: a model's requests cost one attribute test.
The model is this router's alone (other routers' requests move an engine's cache too): a wrong guess costs
one load in the engine, never a failed request.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from llmgw.core import adapteraffinity
from llmgw.router.table import ModelRoute, RouteTable


class AdapterCaches:
    """Replica id -> the adapters this router last sent there, least recently used first, at most its slots."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, ...]] = {}

    def exclude(self, route: ModelRoute, ids: Sequence[str], in_flight: Mapping[str, int],
                exclude: Collection[str]) -> Collection[str]:
        """``exclude`` and the replicas affinity leaves out for ``route``'s request (none left: ``exclude``)."""
        chosen, _ = adapteraffinity.candidates(route.name, ids, self.held, in_flight, exclude=exclude)
        if not chosen:
            return exclude
        return {*exclude, *(r for r in ids if r not in chosen)}

    def used(self, route: ModelRoute, replica_id: str) -> None:
        """``route``'s request went to ``replica_id``: its engine now holds the adapter, most recently used."""
        self.held[replica_id], _ = adapteraffinity.touch(self.held.get(replica_id, ()), route.name,
                                                         route.adapter_slots)

    def follow(self, table: RouteTable) -> None:
        """Forget the replicas a new table no longer lists (a restarted engine holds nothing)."""
        if self.held:
            live = {e.replica_id for m in table.models if m.parent for e in m.endpoints}
            for gone in [r for r in self.held if r not in live]:
                del self.held[gone]
