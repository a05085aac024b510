"""A supervisor on its own event loop, for tests that drive it step by step from synchronous code."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import psutil

from llmgw.agent.supervisor import Supervisor
from llmgw.core.shards import ShardState, ShardStatus


def children() -> set[tuple[int, float]]:
    """This process's children now, as (pid, start time): a pid reused later is another process."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            out.add((child.pid, child.create_time()))
    return out


def kill_started_since(before: set[tuple[int, float]], *, spare: str = "") -> None:
    """Kill this process's children that were not there in ``before``: what the test started, never a server of
    the session's (a PostgreSQL another fixture started) or another test's."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if (child.pid, child.create_time()) in before:
                continue
            if spare and spare in " ".join(child.cmdline()):
                continue
            child.kill()


class SupervisorHarness:
    """A supervisor, the loop it runs on, and every status it reported."""

    def __init__(self, run_dir: Path, **kw: Any) -> None:
        self.before = children()
        self.loop = asyncio.new_event_loop()
        self.seen: list[ShardStatus] = []
        kw = {"health_interval_s": 0.1, "grace_s": 2.0, **kw}
        self.sup = Supervisor(run_dir=run_dir, host="127.0.0.1", on_status=self.seen.append, **kw)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def states(self, shard_id: str) -> list[ShardState]:
        return [s.state for s in self.seen if s.shard_id == shard_id]

    def wait_state(self, shard_id: str, state: ShardState, *, timeout: float = 15.0) -> ShardStatus:
        async def poll() -> ShardStatus:
            deadline = time.monotonic() + timeout
            while (st := self.sup.status(shard_id)) is None or st.state is not state:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{shard_id} is {st and st.state}, not {state}: {st}")
                await asyncio.sleep(0.05)
            return st
        return self.run(poll())


@contextlib.contextmanager
def torn_down(h: SupervisorHarness, *, after: Callable[[], Awaitable[object]] | None = None,
              ) -> Iterator[SupervisorHarness]:
    """``h``; after, whatever happened: its engines stopped, ``after()`` run on its loop (a fetcher closed),
    the loop closed and the processes this one started killed (an ``llmgw mirror`` spared: its test stops it)."""
    try:
        yield h
    finally:
        try:
            h.run(h.sup.stop_all(reason="test over"))
            h.run(h.sup.close())
            if after is not None:
                h.run(after())
        finally:
            h.loop.close()
            kill_started_since(h.before, spare="llmgw mirror")


def run_supervised(run_dir: Path, body: Callable[[Supervisor], Awaitable[None]], **kw: Any) -> list[ShardStatus]:
    """Run ``body(sup)`` on a fresh loop; stop and close the supervisor and kill the children it left after.

    Those are killed whatever happened, so a failing test never leaves an engine running; children this process
    had before (another fixture's servers) are left alone.
    """
    seen: list[ShardStatus] = []
    before = children()

    async def main() -> None:
        sup = Supervisor(run_dir=run_dir, host="127.0.0.1", on_status=seen.append,
                         **{"health_interval_s": 0.1, **kw})
        try:
            await body(sup)
        finally:
            await sup.stop_all(reason="test over")
            await sup.close()

    try:
        asyncio.run(main())
    finally:
        kill_started_since(before)
    return seen


class LeavingHarness(SupervisorHarness):
    """A harness whose agent can go away (``die``) with its engines left running, as a crashed agent leaves them."""

    def __init__(self, run_dir: Path, **kw: Any) -> None:
        super().__init__(run_dir, **kw)
        self.closed = False

    def die(self) -> None:
        """Stop watching and drop the loop, leaving the engines running: an agent that went away."""
        self.run(self.sup.close())
        self.loop.close()
        self.closed = True


@contextlib.contextmanager
def harnesses(run_dir: Path, **defaults: Any) -> Iterator[Callable[..., LeavingHarness]]:
    """A maker of harnesses sharing ``run_dir`` (``defaults`` for each, overridden by the maker's own
    arguments); after, each is stopped and every child of this process started since killed.

    The children are killed whatever the test did: SIGKILL ends a frozen (SIGSTOP) one too.
    """
    made: list[LeavingHarness] = []
    before = children()

    def make(**kw: Any) -> LeavingHarness:
        made.append(LeavingHarness(run_dir, **{**defaults, **kw}))
        return made[-1]

    try:
        yield make
    finally:
        for a in made:
            if not a.closed:
                try:
                    a.run(a.sup.stop_all(reason="test over"))
                    a.run(a.sup.close())
                finally:
                    a.loop.close()
        kill_started_since(before)
