"""``least_outstanding``: the least loaded endpoint, ties round-robin (``pick.LeastOutstanding``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from llmgw.router import pick
from llmgw.router.pick import NO_KEY, E, RequestKey
from llmgw.router.policies.base import NO_LOAD, Options, Policy


class LeastOutstanding(Policy):
    name = "least_outstanding"

    def __init__(self, options: Options = Options()) -> None:
        super().__init__(options)
        self._least = pick.LeastOutstanding()

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        return self._least.pick(model, endpoints, load=load, exclude=exclude), 0
