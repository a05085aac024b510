"""What a routing policy is: a name, whether it reads the request's affinity key, a pick, and two hooks.

The Forwarder (``upstream``) holds one instance of each registered policy and, for each attempt,
calls the one the model's ``routing`` names:

* ``pick(model, endpoints, *, load, key, exclude)``: the endpoint, and how many of the prompt's
  blocks it lacks there (its prefill; 0 from a policy that does not know). ``load``, ``key`` and
  ``exclude`` are as in ``pick``'s module docstring;
* ``routed(...)``: the attempt is about to go to the endpoint picked. Returns None (the usual
  case, and what the base does: nothing more to do for this request) or a ``Ticket`` the
  Forwarder hands back to ``done``;
* ``wait(ticket)``: awaited before the request is sent, only for a ticket whose ``waits`` is set
  (``prefix_cache``: a prefix still in its prefill on that replica);
* ``done(ticket)``: the request's first token came back, or the attempt ended without one.

So a policy that keeps no state per request costs the hot path one call, and no allocation or
await. ``keyed`` says whether ``pick`` reads ``key``: for the others the router does not hash the
prompt at all. The choosing itself stays in the pure modules ``pick`` and ``prefix``; a policy
wraps them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar

from llmgw.router import kvview, prefix
from llmgw.router.pick import NO_KEY, E, RequestKey

NO_LOAD: Mapping[str, float] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """What the Forwarder's settings give the policies it builds (each reads what it needs)."""

    #: The prefix index ``prefix_cache`` records its choices in (None: a fresh one).
    prefix_index: prefix.PrefixIndex | None = None
    #: How long a request may wait for a prefix another is prefilling on its replica; 0: never.
    prefill_wait_s: float = 30.0
    #: ``kv_aware``: the replicas' KV caches as their agents report them (None: a fresh, empty view).
    kv_view: kvview.KvView | None = None
    #: ``kv_aware``: only replicas within this many requests in flight of the least loaded are candidates.
    kv_imbalance: float = 8.0


class Ticket:
    """What ``routed`` hands the Forwarder for one attempt; ``waits``: ``wait`` must be awaited before sending."""

    __slots__ = ("waits",)

    def __init__(self, *, waits: bool = False) -> None:
        self.waits = waits


class Policy:
    """One routing policy; subclasses set ``name`` (the ``routing`` value that selects it) and ``pick``."""

    name: ClassVar[str]
    #: Whether ``pick`` reads the request's affinity key (prompt blocks, session).
    keyed: ClassVar[bool] = False
    #: Whether ``pick`` reads the endpoints' load: a policy that does not is given ``NO_LOAD``, and the router
    #: builds no per-request map of every endpoint's load for it (issue 27: a feature pays only when used).
    uses_load: ClassVar[bool] = True
    #: Whether ``pick`` reads the prompt's token ids (``RequestKey.tokens``): only then are they copied out.
    reads_tokens: ClassVar[bool] = False

    def __init__(self, options: Options = Options()) -> None:
        self.options = options

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        """The endpoint for the request (None once ``exclude`` leaves none) and the prompt blocks it lacks there."""
        raise NotImplementedError

    def routed(self, model: str, engine: str, replica_id: str, lacking: int, key: RequestKey, *,
               stream: bool) -> Ticket | None:
        """Hook: an attempt goes to ``replica_id``; a ticket when ``wait`` or ``done`` have work for it."""
        return None

    async def wait(self, ticket: Ticket) -> None:
        """Hook: before sending, for a ticket whose ``waits`` is set."""

    def done(self, ticket: Ticket) -> None:
        """Hook: the attempt's first token came back, or it ended without one. Called once per ticket."""
