"""One background task a component owns: started once, stopped by cancelling it and waiting for it to end.

Routers, the control plane and agents each hold a few long-running loops (a table watch, a signal sender, a
load poller). Each used to write the same start-if-not-running and cancel-then-await-swallowing-the-
cancellation; this is that pattern once. Standard library only, so every process may use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

#: How long ``stop`` waits for the task to end before it cancels it again.
_RETRY_S = 0.1


class Background:
    """A named background task: ``start`` runs it unless it already runs; ``stop`` cancels it and waits.

    ``stop`` returns once the task has finished (its ``finally`` blocks have run), so a caller may close what
    the task used right after. An exception the task ended with (other than its cancellation) is raised by
    ``stop``, so a loop that died is not silently forgotten.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[Any] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, run: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start ``run()`` as the task, unless one was started and is not stopped yet."""
        if self._task is None:
            self._task = asyncio.create_task(run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # Asked again until it ends: Python 3.11's asyncio.wait_for swallows a cancellation that arrives as
        # what it waits for completes, and a loop around such a wait (a long poll) then never ended: seen as
        # ``llmgw server`` hanging at its stop with its in-process router's table watch still running.
        while not (await asyncio.wait([task], timeout=_RETRY_S))[0]:
            task.cancel()
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
