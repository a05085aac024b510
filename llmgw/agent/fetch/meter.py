"""How far one fetch has come, told to every caller waiting on it at most once a period.

Every caller of ``ensure`` for the same source subscribes to the one meter of its flight, so eight shards
wanting one model all report the one download's progress. Byte counts are throttled to one report per
``period_s`` (the stream to the control plane carries them); a change of state (stalled, verifying, done,
failed) is told at once, because it is what a person waits for. The rate is over a moving window, not
since the start: an average since the start still shows 200 MB/s a minute into a stall.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from llmgw.agent.fetch import records

log = logging.getLogger(__name__)

Callback = Callable[[records.Progress], None]


class Meter:
    """Counts bytes of one fetch and tells its subscribers."""

    def __init__(self, *, clock: Callable[[], float], period_s: float, window_s: float = 5.0) -> None:
        self._clock = clock
        self._period_s = period_s
        self._window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._subscribers: list[Callback] = []
        self._last_told = float("-inf")
        self.done = 0
        self.total = 0
        self.state = "fetching"
        self.message = ""

    def subscribe(self, callback: Callback | None) -> None:
        """Add a caller; it hears where the fetch stands now, then every report after."""
        if callback is None:
            return
        self._subscribers.append(callback)
        self._call(callback, self.snapshot())

    def unsubscribe(self, callback: Callback | None) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def start(self, *, total: int, done: int) -> None:
        """Set where the fetch starts (bytes a resume already holds count as done), and tell it."""
        self.total, self.done = total, done
        self._samples.clear()
        self._set("fetching", "")

    def add(self, n: int) -> None:
        """n more bytes arrived; a stall reported earlier is over."""
        self.done += n
        now = self._clock()
        if not self._samples or now - self._samples[-1][0] >= 0.05:
            self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()
        if self.state != "fetching":
            self._set("fetching", "")
        elif now - self._last_told >= self._period_s:
            self._tell(now)

    def grow(self, n: int) -> None:
        """The total grew by n: a size learnt only from the GET."""
        self.total += n

    def set_state(self, state: str, message: str = "") -> None:
        assert state in records.STATES, state
        self._set(state, message)

    def snapshot(self) -> records.Progress:
        rate = self._rate()
        left = self.total - self.done
        eta = left / rate if rate > 0 and self.total else -1.0
        if self.state == "done":
            eta = 0.0
        return records.Progress(done_bytes=self.done, total_bytes=self.total, rate_bps=rate, eta_s=eta,
                                state=self.state, message=self.message)

    def _rate(self) -> float:
        if self.state != "fetching" or len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def _set(self, state: str, message: str) -> None:
        self.state, self.message = state, message
        self._tell(self._clock())

    def _tell(self, now: float) -> None:
        self._last_told = now
        snap = self.snapshot()
        for cb in list(self._subscribers):
            self._call(cb, snap)

    @staticmethod
    def _call(cb: Callback, snap: records.Progress) -> None:
        # One caller's broken callback must not fail the download seven other shards wait on.
        try:
            cb(snap)
        except Exception:
            log.exception("a fetch progress callback failed; the fetch goes on")
