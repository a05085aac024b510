"""``session_affinity``: a session's requests to one replica by rendezvous hashing (``pick.SessionAffinity``).

Keyed: the session is the ``x-llmgw-session`` header or the body's ``user`` (``prefix.session_of``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from llmgw.router import pick
from llmgw.router.pick import NO_KEY, E, RequestKey
from llmgw.router.policies.base import NO_LOAD, Options, Policy


class SessionAffinity(Policy):
    name = "session_affinity"
    keyed = True

    def __init__(self, options: Options = Options()) -> None:
        super().__init__(options)
        self._affinity = pick.SessionAffinity()

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        return self._affinity.pick(model, endpoints, load=load, key=key, exclude=exclude), 0
