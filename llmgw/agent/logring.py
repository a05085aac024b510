"""The agent's own recent log lines, kept in memory so `llmgw logs NODE` can show them.

Seeing what a node did should not mean ssh and a journal only root may open, so
every record the agent logs is also formatted into a ring of the last few
thousand lines. The ring is a ``logging.Handler``: records arrive from any
thread, under the handler's lock.

Following is a subscription. Each one has its own bounded buffer, filled by
the logging thread and drained by an asyncio task; the logging side never
waits on a reader. A reader that falls behind loses the newest lines rather
than slowing the agent, and is told how many it lost, so a gap in what it
shows is never silent. The event loop is woken once per burst, not once per
line: the wake-up is scheduled only when the buffer goes from empty to full.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from types import TracebackType

DEFAULT_CAPACITY = 2000
DEFAULT_SUBSCRIBER_BUFFER = 1000
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Subscription:
    """New lines from one ring, in order, for one asyncio reader. Made by :meth:`LogRing.subscribe`."""

    def __init__(self, ring: LogRing, loop: asyncio.AbstractEventLoop, maxsize: int) -> None:
        self._ring = ring
        self._loop = loop
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._buf: collections.deque[str] = collections.deque()
        self._dropped = 0
        self._wake_pending = False
        self._closed = False
        self._ready = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, lines: list[str]) -> bool:
        """Called by the ring from any thread; never blocks. False once this subscription is gone."""
        with self._lock:
            if self._closed:
                return False
            room = self._maxsize - len(self._buf)
            self._buf.extend(lines[:max(room, 0)])
            self._dropped += max(len(lines) - max(room, 0), 0)
            if self._wake_pending:
                return True
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            # The reader's loop has closed without closing us: nobody will read
            # again, and keeping the subscription would fill its buffer forever.
            with self._lock:
                self._closed = True
            return False
        return True

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._ready.set()

    async def next_batch(self) -> tuple[list[str], int]:
        """Waits for new lines; returns them and how many were dropped before this call (after them).

        Raises StopAsyncIteration once closed and drained.
        """
        while True:
            with self._lock:
                if self._buf or self._dropped:
                    lines, dropped = list(self._buf), self._dropped
                    self._buf.clear()
                    self._dropped = 0
                    return lines, dropped
                if self._closed:
                    raise StopAsyncIteration
                self._ready.clear()
            await self._ready.wait()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> tuple[list[str], int]:
        return await self.next_batch()

    def close(self) -> None:
        """Stops delivery and ends a waiting :meth:`next_batch`. Safe to call twice, and from any thread."""
        with self._lock:
            already, self._closed = self._closed, True
        if already:
            return
        self._ring.unsubscribe(self)
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:
            pass  # The loop is closed; nothing can be waiting on it.

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LogRing(logging.Handler):
    """The last ``capacity`` formatted lines, and live delivery to subscribers."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a log ring needs room for at least one line, got capacity {capacity}")
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))
        self._lines: collections.deque[str] = collections.deque(maxlen=capacity)
        self._subscribers: list[Subscription] = []

    @property
    def capacity(self) -> int:
        return self._lines.maxlen or 0

    def emit(self, record: logging.LogRecord) -> None:
        # Called by Handler.handle with self.lock held, from whatever thread logged.
        try:
            # One entry per physical line, so a traceback does not arrive as one
            # string with newlines in it, and `capacity` bounds memory in lines.
            lines = self.format(record).splitlines() or [""]
            self._lines.extend(lines)
            for sub in list(self._subscribers):
                if not sub.offer(lines):
                    self._subscribers.remove(sub)
        except Exception:
            self.handleError(record)

    def tail(self, n: int) -> list[str]:
        """The last ``n`` lines, oldest first."""
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock always sets it
            if n <= 0:
                return []
            return list(self._lines)[-n:]

    def subscribe(self, *, maxsize: int = DEFAULT_SUBSCRIBER_BUFFER) -> Subscription:
        """Every line logged from now on, for a reader on the running event loop."""
        return self.tail_and_subscribe(0, maxsize=maxsize)[1]

    def tail_and_subscribe(self, n: int, *, maxsize: int = DEFAULT_SUBSCRIBER_BUFFER) -> tuple[list[str], Subscription]:
        """The last ``n`` lines and a subscription starting right after them.

        Taken under one lock: with a separate tail() and subscribe(), a line
        logged between the two was either lost or shown twice.
        """
        loop = asyncio.get_running_loop()
        sub = Subscription(self, loop, maxsize)
        with self.lock:  # type: ignore[union-attr]
            lines = list(self._lines)[-n:] if n > 0 else []
            self._subscribers.append(sub)
        return lines, sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self.lock:  # type: ignore[union-attr]
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    @property
    def subscriber_count(self) -> int:
        with self.lock:  # type: ignore[union-attr]
            return len(self._subscribers)


def install(ring: LogRing, *, level: int = logging.INFO) -> LogRing:
    """Attaches ``ring`` to the root logger at ``level``; a second call does not attach it twice.

    The root logger's own level still decides which records exist at all: the
    ring keeps what the agent was told to log, no more.
    """
    ring.setLevel(level)
    root = logging.getLogger()
    if ring not in root.handlers:
        root.addHandler(ring)
    return ring
