"""The newest time per key, handed on at most once every ``every_s`` per key: how "last used" travels.

A key's use is seen on every request a router lets it make, but the control plane needs only its newest
time, and a write per request would make a busy key a database write a request. ``Latest`` keeps, per
key, the newest time offered since it was last taken, and says when that key may be taken again: at
once for a key not taken within ``every_s``, otherwise when its interval is over. The caller schedules
that one take (the router's ``keyuse``, the control plane's ``keyuse``), so the last use of a burst is
handed on too, never lost behind the throttle; a key used again before its take is only a dict update.

Pure: no clock and no loop of its own; ``now`` is passed in.
"""

from __future__ import annotations


class Latest:
    """Per key, the newest time offered and not yet taken, and when the key was last taken."""

    def __init__(self, *, every_s: float) -> None:
        self.every_s = every_s
        self._pending: dict[str, float] = {}
        self._taken_at: dict[str, float] = {}
        self._scheduled: set[str] = set()

    def offer(self, key: str, at: float, *, now: float) -> float | None:
        """Notes that ``key`` was used ``at``. Returns the seconds until it should be taken (0: now) when the
        caller must schedule that take, or None when one is already due or scheduled."""
        if at > self._pending.get(key, float("-inf")):
            self._pending[key] = at
        if key in self._scheduled:
            return None
        self._scheduled.add(key)
        return max(0.0, self._taken_at.get(key, float("-inf")) + self.every_s - now)

    def take(self, key: str, *, now: float) -> float | None:
        """The newest time of ``key`` offered since its last take (None: none), and marks it taken ``now``."""
        self._scheduled.discard(key)
        at = self._pending.pop(key, None)
        if at is not None:
            self._taken_at[key] = now
        return at

    def take_all(self, *, now: float) -> dict[str, float]:
        """Everything pending, as at a shutdown: each key's newest time."""
        out = {key: at for key in list(self._pending) if (at := self.take(key, now=now)) is not None}
        self._scheduled.clear()
        return out
