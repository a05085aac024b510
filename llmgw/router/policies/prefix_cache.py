"""``prefix_cache``, the default: the replica where the prompt costs least, and waiting for a prefix in its prefill.

The choice is ``prefix.PrefixCache``'s (pure; its docstring says how the cost is weighed). This
policy adds what needs the request's life: the prompt blocks a request lacks on its replica are
charged there until its first token (``routed`` / ``done``: the prefill queued there, which later
choices weigh), and a streamed request whose prompt shares a long prefix with one still in its
prefill on the chosen replica waits for that one's first token before it is sent
(``prefix.Prefilling`` says why), at most ``Options.prefill_wait_s``; an engine can reuse only a
prefix it has finished. Not on llama.cpp, where a cached prefix serves one request at a time
(``prefix.exclusive_prefix``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence

from llmgw.router import metrics, prefix
from llmgw.router.pick import NO_KEY, E, RequestKey
from llmgw.router.policies.base import NO_LOAD, Options, Policy, Ticket


class _Prefill(Ticket):
    """One attempt's charge (blocks queued on its replica) and, once it leads a prefix, its leader token."""

    __slots__ = ("model", "replica_id", "blocks", "charge", "lead")

    def __init__(self, model: str, replica_id: str, blocks: tuple[int, ...], charge: int | None, *,
                 waits: bool) -> None:
        super().__init__(waits=waits)
        self.model, self.replica_id, self.blocks = model, replica_id, blocks
        self.charge = charge
        self.lead: int | None = None


class PrefixCache(Policy):
    name = "prefix_cache"
    keyed = True

    def __init__(self, options: Options = Options()) -> None:
        super().__init__(options)
        self.cache = prefix.PrefixCache(options.prefix_index)
        #: Prompts whose prefill is running, per replica, and the event each one's followers wait on.
        self.prefilling = prefix.Prefilling()
        self._prefill_done: dict[int, asyncio.Event] = {}

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        return self.cache.choose(model, endpoints, load=load, key=key, exclude=exclude)

    def routed(self, model: str, engine: str, replica_id: str, lacking: int, key: RequestKey, *,
               stream: bool) -> Ticket | None:
        # Charged before any wait, so requests picked meanwhile see this one's prefill queued.
        charge = self.cache.charge(replica_id, lacking)
        # Only a stream's first chunk says when its prefill ended, so only streams lead a prefix.
        waits = bool(stream and key.blocks and self.options.prefill_wait_s > 0
                     and not prefix.exclusive_prefix(engine))
        if charge is None and not waits:
            return None
        return _Prefill(model, replica_id, key.blocks, charge, waits=waits)

    async def wait(self, ticket: Ticket) -> None:
        assert isinstance(ticket, _Prefill)
        await self._follow(ticket.model, ticket.replica_id, ticket.blocks)
        ticket.lead = self.lead(ticket.model, ticket.replica_id, ticket.blocks)

    def done(self, ticket: Ticket) -> None:
        """The request's first token came back, or it ended without one: its followers go, its prefill is paid."""
        assert isinstance(ticket, _Prefill)
        charge, ticket.charge = ticket.charge, None
        if charge is not None:
            self.cache.settle(charge)
        token, ticket.lead = ticket.lead, None
        if token is None:
            return
        self.prefilling.end(token)
        event = self._prefill_done.pop(token, None)
        if event is not None:
            event.set()

    async def _follow(self, model: str, replica_id: str, blocks: tuple[int, ...]) -> None:
        """Wait (bounded) for the request computing this prompt's prefix on ``replica_id`` to get its first token."""
        leader = self.prefilling.leader(model, replica_id, blocks)
        event = self._prefill_done.get(leader) if leader is not None else None
        if event is None:
            return
        metrics.count_prefill_wait(model, replica_id)
        try:
            await asyncio.wait_for(event.wait(), self.options.prefill_wait_s)
        except TimeoutError:
            pass  # a slow prefill: computing the prefix again beats waiting on without a bound

    def lead(self, model: str, replica_id: str, blocks: tuple[int, ...]) -> int | None:
        """Registers a request now computing ``blocks`` on ``replica_id``; the token its ``done`` ends."""
        token = self.prefilling.begin(model, replica_id, blocks)
        if token is not None:
            self._prefill_done[token] = asyncio.Event()
        return token
