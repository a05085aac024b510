"""llmgw.core.background: one task per holder, stopped by cancel-and-wait, failures not swallowed."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.core.background import Background


def test_start_runs_once_and_stop_waits_for_cleanup() -> None:
    asyncio.run(_start_runs_once())


async def _start_runs_once() -> None:
    started: list[int] = []
    cleaned = asyncio.Event()

    async def loop() -> None:
        started.append(1)
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.set()

    bg = Background("test-loop")
    bg.start(loop)
    bg.start(loop)            # already running: not a second task
    await asyncio.sleep(0)
    assert started == [1] and bg.running
    await bg.stop()
    assert cleaned.is_set() and not bg.running
    await bg.stop()           # stopping twice is harmless
    bg.start(loop)            # and it may start again
    await asyncio.sleep(0)
    assert started == [1, 1]
    await bg.stop()


def test_stop_raises_what_the_task_died_of() -> None:
    asyncio.run(_stop_raises())


async def _stop_raises() -> None:
    async def broken() -> None:
        raise RuntimeError("the loop broke")

    bg = Background("broken")
    bg.start(broken)
    await asyncio.sleep(0.01)
    assert not bg.running
    with pytest.raises(RuntimeError, match="the loop broke"):
        await bg.stop()


def test_stop_ends_a_task_that_swallowed_its_cancellation() -> None:
    """A loop whose wait swallowed the cancellation (3.11's wait_for can) is cancelled again until it ends."""
    asyncio.run(_swallowed())


async def _swallowed() -> None:
    rounds: list[int] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not rounds:            # the first cancellation lost, as inside wait_for
                    rounds.append(1)
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    continue
                raise

    bg = Background("stubborn")
    bg.start(stubborn)
    await asyncio.sleep(0)
    await asyncio.wait_for(bg.stop(), 5)
    assert rounds == [1] and not bg.running
