"""``round_robin``: each model's endpoints in table order (``pick.RoundRobin``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from llmgw.router import pick
from llmgw.router.pick import NO_KEY, E, RequestKey
from llmgw.router.policies.base import NO_LOAD, Options, Policy


class RoundRobin(Policy):
    name = "round_robin"
    uses_load = False

    def __init__(self, options: Options = Options()) -> None:
        super().__init__(options)
        self._walk = pick.RoundRobin()

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        return self._walk.pick(model, endpoints, exclude=exclude), 0
