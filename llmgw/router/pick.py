"""Choosing an endpoint for a request: pure policies, no I/O and no clock.

Every policy answers ``pick(model, endpoints, *, load, key, exclude)``:

* ``load`` maps replica id to its current load (``loadwatch`` documents the
  formula); a replica missing from it counts as idle;
* ``key`` is what the request offers for affinity: a session key and the chained
  hashes of its prompt's blocks (``prefix`` computes them);
* ``exclude`` holds the replica ids a retry already tried, and the ones ejected
  by ``health``: the policy skips them and returns None once none is left.

Per-model state (cursors) is keyed by model name, not by table, so a table swap
(every replica start or stop) does not send the next burst of requests back to
the first endpoint.

* ``RoundRobin`` walks a model's endpoints in table order.
* ``LeastOutstanding`` takes the least loaded; ties go round-robin, or an idle
  cluster would send every request to the first endpoint.
* ``SessionAffinity`` hashes the session key over the endpoints by rendezvous
  (highest random weight) hashing: adding or removing one endpoint moves only
  the sessions that land on it, about 1/n of them. No key: least outstanding.

``prefix.PrefixCache`` is the fourth, and the default (see ``DEFAULT_ROUTING``). The router
calls them through ``policies`` (one file per policy, registered by name), which adds what
needs a request's life (its prefill charged, a wait on a prefix in its prefill); these stay pure.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from llmgw.core import specs


class _HasReplicaId(Protocol):
    # A protocol rather than table.Endpoint: pure policies import only the standard
    # library and llmgw.core, so they can be tested and reused without the router.
    @property
    def replica_id(self) -> str: ...


E = TypeVar("E", bound=_HasReplicaId)

#: The ``routing`` values a model may name in the endpoints document: the spec's, one
#: ``policies`` module each (``policies.REGISTRY``, tested equal).
ROUTINGS = specs.ROUTING_POLICIES
#: Prefix-aware by default: a chat fleet shares system prompts, and an engine that
#: already holds a prompt's KV blocks skips their prefill; with no prefix to match it
#: is least outstanding, which beats round-robin whenever requests differ in length.
DEFAULT_ROUTING = "prefix_cache"


@dataclasses.dataclass(frozen=True, slots=True)
class RequestKey:
    """What a request offers for affinity: its session key and its prompt's chained block hashes."""

    session: str = ""
    blocks: tuple[int, ...] = ()
    #: The prompt's token ids when the request carries them (a completion's ``prompt`` as token ids): what
    #: ``kv_aware`` hashes as the engine does. The router has no tokenizer, so a text prompt has none.
    tokens: tuple[int, ...] = ()


NO_KEY = RequestKey()
_NO_LOAD: Mapping[str, float] = {}


class Policy(Protocol):
    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = ...,
             key: RequestKey = ..., exclude: Collection[str] = ...) -> E | None: ...


class RoundRobin:
    """Round-robin over each model's endpoints, skipping ones a request already tried."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = _NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> E | None:
        """The next endpoint of ``model`` whose replica id is not in ``exclude``, or None."""
        return self.pick_among(model, endpoints, lambda _: True, exclude=exclude)

    def pick_among(self, model: str, endpoints: Sequence[E], accept: _Accept, *,
                   exclude: Collection[str] = ()) -> E | None:
        """The next endpoint in the walk that ``accept`` takes and ``exclude`` does not name."""
        n = len(endpoints)
        if n == 0:
            return None
        start = self._next.get(model, 0) % n
        for step in range(n):
            i = (start + step) % n
            endpoint = endpoints[i]
            if endpoint.replica_id not in exclude and accept(endpoint):
                # The cursor moves past the one chosen, not by one: after a retry skips a
                # dead endpoint, the next request starts after the one that served.
                self._next[model] = i + 1
                return endpoint
        return None


class _Accept(Protocol):
    def __call__(self, endpoint: _HasReplicaId, /) -> bool: ...


class LeastOutstanding:
    """The endpoint with the least load; among equals, round-robin."""

    def __init__(self) -> None:
        self._ties = RoundRobin()

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = _NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> E | None:
        loads = [load.get(e.replica_id, 0.0) for e in endpoints if e.replica_id not in exclude]
        if not loads:
            return None
        least = min(loads)
        return self._ties.pick_among(model, endpoints, lambda e: load.get(e.replica_id, 0.0) <= least,
                                     exclude=exclude)


def hrw_weight(session: str, replica_id: str) -> int:
    """The rendezvous weight of ``replica_id`` for ``session``: stable across processes and restarts."""
    # blake2b, not hash(): str hashes are salted per process, so two routers (or one
    # restarted) would send the same session to different replicas.
    digest = hashlib.blake2b(f"{session}\x00{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class SessionAffinity:
    """Rendezvous hashing of the session key over the endpoints; no key: least outstanding."""

    def __init__(self) -> None:
        self._fallback = LeastOutstanding()

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = _NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> E | None:
        if not key.session:
            return self._fallback.pick(model, endpoints, load=load, exclude=exclude)
        candidates = [e for e in endpoints if e.replica_id not in exclude]
        if not candidates:
            return None
        # A retry excludes the session's first choice and so lands on its second: the
        # same replica every retry of that session would reach.
        return max(candidates, key=lambda e: hrw_weight(key.session, e.replica_id))


def at_limit(replica_ids: Iterable[str], in_flight: Mapping[str, int], limit: int) -> set[str]:
    """The replicas with ``limit`` or more requests in flight: a policy must not pick them.

    ``limit`` 0 is no limit. Admission lets no more requests through than the
    endpoints can take together, so while it holds at least one is below its limit.
    """
    if not limit or not in_flight:  # the common cases: no limit, or nothing in flight
        return set()
    return {r for r in replica_ids if in_flight.get(r, 0) >= limit}
