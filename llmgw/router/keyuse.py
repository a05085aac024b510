"""When each API key was last used here, told to the control plane at most once every few seconds per key.

Routers authenticate keys themselves, from the table (``auth``), so only a router knows that a key was
used; the keys page and ``llmgw key list`` show the time it last was. ``KeyUse.used`` is called on the
request's path once its key is identified: it costs a dict update, and a report (``Sink.key_used``
delivers it as a ``key_used`` event) leaves at once for a key not reported in the last ``every_s``, or
when that interval ends, carrying the newest use, so the last request of a burst is reported too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from llmgw.core import latest

#: Seconds between two reports of the same key: "last used 2m ago" needs no finer grain, and a busy key
#: costs the control plane one write in this long rather than one a request.
EVERY_S = 5.0


class KeyUse:
    """Per key id, the newest use, handed to ``report(key_id, at)`` at most once every ``every_s``."""

    def __init__(self, report: Callable[[str, float], None], *, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._report = report
        self._clock = clock
        self._latest = latest.Latest(every_s=every_s)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def used(self, key_id: str) -> None:
        """Notes a use of ``key_id`` now; call it on the event loop."""
        now = self._clock()
        delay = self._latest.offer(key_id, now, now=now)
        if delay is None:
            return  # a report is already due for this key: it will carry this use
        if delay <= 0:
            self._send(key_id)
        else:
            self._timers[key_id] = asyncio.get_running_loop().call_later(delay, self._send, key_id)

    def _send(self, key_id: str) -> None:
        self._timers.pop(key_id, None)
        at = self._latest.take(key_id, now=self._clock())
        if at is not None:
            self._report(key_id, at)

    def flush(self) -> None:
        """Reports every pending use now (at a shutdown), so the last ones are not lost with the timers."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for key_id, at in self._latest.take_all(now=self._clock()).items():
            self._report(key_id, at)
