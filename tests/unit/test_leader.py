"""Leader election over the store's lease row (``control.leader``), two instances on one SQLite database."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.control import leader
from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Store
from llmgw.core.errors import LlmgwError

#: Short, so a test waits out a lease in well under a second; the rule (two renewals before the margin) holds.
TIMING = leader.Timing(lease_s=0.8, renew_s=0.1, margin_s=0.2)


class Instance:
    """One Leadership with its own store connection, recording what it was told."""

    def __init__(self, path: Path, name: str) -> None:
        self.store = Store.open(path)
        self.told: list[str] = []
        self.lead = leader.Leadership(self.store, leader.Me(name, f"http://{name}:8080", f"{name}:8081", "v1"),
                                      timing=TIMING, on_elected=self._elected, on_deposed=self._deposed)
        self.task: asyncio.Task[None] | None = None

    async def _elected(self, term: int) -> None:
        self.told.append(f"elected {term}")

    async def _deposed(self, reason: str) -> None:
        self.told.append(f"deposed: {reason}")

    def start(self) -> None:
        self.lead._stopped = False  # woken up again after kill()
        self.task = asyncio.create_task(self.lead.run())

    async def kill(self) -> None:
        """Stops the loop without giving the lease up, as a process killed with SIGKILL leaves it."""
        if self.task is not None:
            self.lead.stop()
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


async def until(predicate: object, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 (polling state another task changes)
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


@contextlib.asynccontextmanager
async def two(tmp_path: Path) -> AsyncIterator[tuple[Instance, Instance]]:
    a, b = Instance(tmp_path, "cp-a"), Instance(tmp_path, "cp-b")
    try:
        yield a, b
    finally:
        for i in (a, b):
            await i.kill()
            i.lead._pool.shutdown(wait=True)
            i.store.close()


def test_one_leads_and_a_killed_leader_is_replaced_with_a_new_term(tmp_path: Path) -> None:
    """The first to run leads at term 1; the other stands by, knows where the leader is, and takes over at
    term 2 once the leader stops renewing; the dead leader's store can no longer write."""
    asyncio.run(_one_leads_and_a_killed_leader_is_replaced_with_a_new_term(tmp_path))


async def _one_leads_and_a_killed_leader_is_replaced_with_a_new_term(tmp_path: Path) -> None:
    async with two(tmp_path) as (a, b):
        a.start()
        await until(lambda: a.lead.leading)
        b.start()
        await until(lambda: b.lead.leader() is not None)
        assert not b.lead.leading and a.told == ["elected 1"] and b.told == []
        found = b.lead.leader()
        assert found is not None and (found.id, found.http_url, found.agent_addr) == ("cp-a", "http://cp-a:8080",
                                                                                       "cp-a:8081")
        assert set(b.lead.peers()) == {"cp-a:8081", "cp-b:8081"}
        roles = {i.id: (i.role, i.term) for i in b.lead.describe()}
        assert roles == {"cp-a": ("leader", 1), "cp-b": ("standby", 0)}
        a.store.put_settings({"written": "at term 1"})  # the leader writes
        with pytest.raises(store_mod.Fenced):
            b.store.put_settings({"written": "by a standby"})
        await a.kill()
        await until(lambda: b.lead.leading)
        assert b.told == ["elected 2"] and b.lead.term == 2
        with pytest.raises(store_mod.Fenced, match="held by cp-b at term 2"):
            a.store.put_settings({"written": "by the deposed"})
        assert b.store.settings() == {"written": "at term 1"}


def test_a_clean_stop_hands_the_lease_over_without_waiting_it_out(tmp_path: Path) -> None:
    """release() ends the lease at once: the standby leads at its next try, not a lease later."""
    asyncio.run(_a_clean_stop_hands_the_lease_over_without_waiting_it_out(tmp_path))


async def _a_clean_stop_hands_the_lease_over_without_waiting_it_out(tmp_path: Path) -> None:
    async with two(tmp_path) as (a, b):
        a.start()
        await until(lambda: a.lead.leading)
        b.start()
        await until(lambda: b.lead.leader() is not None)
        await a.kill()
        await a.lead.release()
        assert b.lead.lease is not None
        await until(lambda: b.lead.leading, timeout=TIMING.lease_s / 2)
        assert b.lead.term == 2


def test_a_leader_whose_lease_was_taken_steps_down(tmp_path: Path) -> None:
    """When another instance holds the lease at a newer term (the leader was paused past it), the old leader's
    next renewal fails and it is told to stand by; it may no longer act."""
    asyncio.run(_a_leader_whose_lease_was_taken_steps_down(tmp_path))


async def _a_leader_whose_lease_was_taken_steps_down(tmp_path: Path) -> None:
    async with two(tmp_path) as (a, b):
        a.start()
        await until(lambda: a.lead.leading)
        await a.kill()  # paused: no renewal
        await asyncio.sleep(TIMING.lease_s + 0.1)
        taken = b.store.take_lease("cp-b", now=b.store.db_now(), lease_s=30.0)
        assert taken is not None and taken.term == 2
        a.start()  # woken up
        await until(lambda: not a.lead.leading)
        assert a.told[-1].startswith("deposed: ") and not a.lead.valid()
        assert a.store.fence == store_mod.STANDBY


def test_timings_that_would_depose_a_healthy_leader_are_refused() -> None:
    """A lease too short for two renewals before the margin is refused, saying what to change."""
    with pytest.raises(LlmgwError, match="--lease"):
        leader.Timing(lease_s=2.0, renew_s=1.0, margin_s=0.5).check()
    leader.Timing().check()
    leader.FAST.check()


def test_the_instance_id_is_kept_in_the_data_directory(tmp_path: Path) -> None:
    """The id is made once, 0600, and read back the same after a restart."""
    first = leader.instance_id(tmp_path)
    assert first and leader.instance_id(tmp_path) == first
    assert (tmp_path / leader.INSTANCE_FILE).stat().st_mode & 0o777 == 0o600
