"""How many requests the sim engine serves at once, and what it counts.

At most ``parallel`` requests generate at once; the rest wait in FIFO order (``Slots``). ``Stats`` keeps the
counts and the recent requests ``/sim/stats`` reports, so a test sees what a router let through and when.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any


class Slots:
    """At most ``parallel`` holders at once; the rest wait first come, first served."""

    def __init__(self, parallel: int) -> None:
        self._free = parallel
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self.running = 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def acquire(self) -> None:
        if self._free > 0 and not self._queue:
            self._free -= 1
            self.running += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Granted a slot in the same tick it was cancelled: hand it on, or it leaks.
                self.release()
            elif future in self._queue:
                # (A release() may already have popped and skipped it: at shutdown every handler
                # is cancelled at once, and removing it again raised ValueError.)
                self._queue.remove(future)
            raise

    def release(self) -> None:
        self.running -= 1
        while self._queue:
            future = self._queue.popleft()
            if not future.done():
                self.running += 1
                future.set_result(None)
                return
        self._free += 1

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


@dataclasses.dataclass(slots=True)
class Stats:
    """Request counts since start (running and waiting come from Slots)."""

    total: int = 0
    completed: int = 0
    aborted: int = 0
    #: Completion requests held now (running or waiting), and the most held at once since
    #: start: what a router's per-replica concurrency limit bounds.
    inside: int = 0
    peak_inside: int = 0
    #: The last ``traceparent`` headers received, so a test can see a router passed its trace on.
    traceparents: collections.deque[str] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=256))
    #: The last aborts: the request's ``user`` field (a test's tag for it), and when, in
    #: ``time.monotonic()`` seconds (one clock for every process on a Linux machine), so a
    #: test or bench can tell which requests were aborted and how soon after their client left.
    aborts: collections.deque[tuple[str, float]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096))
    #: The last requests: ``user``, when each arrived and when its first token went out
    #: (``time.monotonic()``; first is None until then, and for whole responses), so a test
    #: can see the order in which a router let requests reach the engine.
    arrivals: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096))
    #: The last request bodies, as received (/sim/stats ``requests``), so a test can see what a
    #: client sent through a router: the whole conversation, the sampling parameters.
    requests: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=64))
