"""Weighted fair queuing (issue 32): the order a model's admission queue admits its waiters in.

Pure decision code on plain data, tested as such (``tests/unit/test_fairqueue.py``); ``router.admission`` keeps
one ``FairQueue`` per model and pops it as slots free.

Each waiter has a *tier* and a *flow*:

- the tier is strict: a lower tier is admitted only while no higher one waits. It is the request's class rank
  (``core.queueclasses``: 0 the highest) and then the key's legacy integer ``priority`` (higher first), so a
  cluster that sets no class orders by ``priority`` as 0.2.0 did;
- within a tier, flows (a project; a key outside any project) share by weight with self-clocked fair queuing
  (SCFQ, Golestani 1994): a waiter's finish tag is ``max(V, flow's last finish) + 1 / weight`` and the
  smallest tag goes first, ``V`` being the tag of the one admitted last. A flow that queued 100 waiters has
  tags 1, 2, ... 100 ahead of it; a flow arriving with one gets ``V + 1`` and goes next but one, not 101st.
  Over any interval where flows i and j both wait, their admissions per unit of weight differ by at most
  ``1/w_i + 1/w_j`` (SCFQ's fairness bound).
  Within a flow, first come first served (tags increase).

``fair=False`` is first come first served within a tier (the bench's baseline, and ``--admission-order fifo``).

A waiter that leaves before it is admitted is popped and skipped by its owner (the queue holds opaque items);
its tag stays spent, a flow that gives up pays for the place it held. A tier's state (``V``, each flow's last
tag) is dropped when it empties, so memory is bounded by the waiters, not by every flow ever seen.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Generic, TypeVar

T = TypeVar("T")

#: The smallest weight a flow may have (a weight is a share: 0 would never be served).
MIN_WEIGHT = 0.01
#: The largest weight (beyond it a finish tag's step rounds away).
MAX_WEIGHT = 10000.0


@dataclasses.dataclass(slots=True)
class _Tier:
    virtual: float = 0.0  # V: the finish tag admitted last
    last: dict[str, float] = dataclasses.field(default_factory=dict)  # each flow's last finish tag
    waiting: int = 0


class FairQueue(Generic[T]):
    """Waiters by tier (strict), then by weighted fair share of their flow (or arrival, ``fair=False``)."""

    __slots__ = ("fair", "_heap", "_tiers", "_seq")

    def __init__(self, *, fair: bool = True) -> None:
        self.fair = fair
        # (tier, finish tag, arrival, item); the tier sorts first, so a lower one waits for the higher ones.
        self._heap: list[tuple[tuple[int, int], float, int, T]] = []
        self._tiers: dict[tuple[int, int], _Tier] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: T, *, rank: int = 0, priority: int = 0, flow: str = "", weight: float = 1.0) -> float:
        """Queues ``item``; answers its finish tag (0.0 when not fair)."""
        tier_key = (rank, -priority)
        tier = self._tiers.get(tier_key)
        if tier is None:
            tier = self._tiers[tier_key] = _Tier()
        tier.waiting += 1
        finish = 0.0
        if self.fair:
            finish = max(tier.virtual, tier.last.get(flow, 0.0)) + 1.0 / min(max(weight, MIN_WEIGHT), MAX_WEIGHT)
            tier.last[flow] = finish
        heapq.heappush(self._heap, (tier_key, finish, next(self._seq), item))
        return finish

    def pop(self) -> T | None:
        """The next waiter to admit, or None when none waits."""
        if not self._heap:
            return None
        tier_key, finish, _, item = heapq.heappop(self._heap)
        tier = self._tiers[tier_key]
        tier.waiting -= 1
        if tier.waiting == 0:
            del self._tiers[tier_key]  # empty: a later burst starts from V = 0 with no flow's history
        else:
            tier.virtual = finish
        return item
