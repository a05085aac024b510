"""Choosing an endpoint for a request: pure policies, no I/O and no clock.

``RoundRobin`` keeps one cursor per model and walks that model's ready endpoints
in table order. The cursor is keyed by model name, not by table, so a table swap
(every replica start or stop) does not send the next burst of requests back to
the first endpoint.

A retry passes the replica ids already tried in ``exclude``: the walk then skips
them, so one request never lands twice on an endpoint that just failed it, and
``pick`` returns None once every endpoint has been tried.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar


class _HasReplicaId(Protocol):
    # A protocol rather than table.Endpoint: pure policies import only the standard
    # library and llmgw.core, so they can be tested and reused without the router.
    @property
    def replica_id(self) -> str: ...


E = TypeVar("E", bound=_HasReplicaId)


class RoundRobin:
    """Round-robin over each model's endpoints, skipping ones a request already tried."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def pick(self, model: str, endpoints: Sequence[E], *, exclude: Collection[str] = ()) -> E | None:
        """The next endpoint of ``model`` whose replica id is not in ``exclude``, or None."""
        n = len(endpoints)
        if n == 0:
            return None
        start = self._next.get(model, 0) % n
        for step in range(n):
            i = (start + step) % n
            endpoint = endpoints[i]
            if endpoint.replica_id not in exclude:
                # The cursor moves past the one chosen, not by one: after a retry skips a
                # dead endpoint, the next request starts after the one that served.
                self._next[model] = i + 1
                return endpoint
        return None
