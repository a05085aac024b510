"""Admission: per-model slots, a bounded priority queue, a maximum wait, and slots that are never lost."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.router import admission
from llmgw.router.table import RouteTable


async def _hold(adm: admission.Admission, model: str, order: list[str], name: str, *, priority: int = 0,
                release: asyncio.Event) -> None:
    async with adm.slot(model, priority=priority):
        order.append(name)
        await release.wait()


def test_priority_first_then_fifo() -> None:
    """Waiters are admitted higher priority first, and in arrival order within a priority."""
    async def main() -> list[str]:
        adm = admission.Admission(default_limit=1, max_queue=10, max_wait_s=5)
        order: list[str] = []
        gates = {n: asyncio.Event() for n in ("first", "low1", "high", "low2", "mid")}
        tasks = [asyncio.create_task(_hold(adm, "m", order, "first", release=gates["first"]))]
        await asyncio.sleep(0)
        for name, prio in (("low1", 0), ("high", 9), ("low2", 0), ("mid", 5)):
            tasks.append(asyncio.create_task(_hold(adm, "m", order, name, priority=prio, release=gates[name])))
            await asyncio.sleep(0)
        assert adm.queued("m") == 4 and adm.in_flight("m") == 1 and adm.queue_length == 4
        for name in ("first", "high", "mid", "low1", "low2"):
            gates[name].set()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        assert adm.in_flight("m") == 0 and adm.queued("m") == 0
        return order

    assert asyncio.run(main()) == ["first", "high", "mid", "low1", "low2"]


def test_full_queue_is_429_with_retry_after() -> None:
    """Past max_queue waiters a request is refused at once with 429 and a Retry-After."""
    async def main() -> None:
        adm = admission.Admission(limits={"m": 1}, max_queue=1, max_wait_s=5)
        release, order = asyncio.Event(), []
        held = [asyncio.create_task(_hold(adm, "m", order, n, release=release)) for n in ("a", "b")]
        await asyncio.sleep(0)
        with pytest.raises(admission.Overloaded) as exc:
            async with adm.slot("m"):
                pass
        assert exc.value.status == 429 and exc.value.retry_after_s >= 1 and adm.rejected == 1
        assert exc.value.headers()[0][0] == b"retry-after"
        release.set()
        await asyncio.gather(*held)
        async with adm.slot("other"):  # a model without a limit is only counted
            assert adm.in_flight("other") == 1

    asyncio.run(main())


def test_max_wait_is_429_and_leaves_the_queue() -> None:
    """A waiter that waits max_wait_s is refused and no longer counted as queued."""
    async def main() -> None:
        adm = admission.Admission(default_limit=1, max_queue=5, max_wait_s=0.05)
        release = asyncio.Event()
        held = asyncio.create_task(_hold(adm, "m", [], "a", release=release))
        await asyncio.sleep(0)
        with pytest.raises(admission.Overloaded) as exc:
            async with adm.slot("m"):
                pass
        assert "0.05s" in exc.value.message and adm.queued("m") == 0
        release.set()
        await held
        async with adm.slot("m"):  # the slot came back
            assert adm.in_flight("m") == 1

    asyncio.run(main())


def test_slot_is_released_on_exception_and_cancel() -> None:
    """An exception in the body, or a waiter cancelled (client gone), never loses a slot."""
    async def main() -> None:
        adm = admission.Admission(default_limit=1, max_queue=5, max_wait_s=5)
        with pytest.raises(RuntimeError):
            async with adm.slot("m"):
                raise RuntimeError("engine failed")
        assert adm.in_flight("m") == 0
        release = asyncio.Event()
        held = asyncio.create_task(_hold(adm, "m", [], "a", release=release))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(_hold(adm, "m", [], "b", release=release))
        await asyncio.sleep(0)
        assert adm.queued("m") == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert adm.queued("m") == 0
        release.set()
        await held
        assert adm.in_flight("m") == 0
        async with adm.slot("m"):
            assert adm.in_flight("m") == 1

    asyncio.run(main())


def test_granted_waiter_that_leaves_passes_the_slot_on() -> None:
    """A waiter cancelled just after being handed a slot hands it to the next waiter."""
    async def main() -> list[str]:
        adm = admission.Admission(default_limit=1, max_queue=5, max_wait_s=5)
        order: list[str] = []
        release = asyncio.Event()
        held = adm.slot("m")
        await held.__aenter__()
        order.append("a")
        second = asyncio.create_task(_hold(adm, "m", order, "b", release=release))
        third = asyncio.create_task(_hold(adm, "m", order, "c", release=release))
        await asyncio.sleep(0)
        await held.__aexit__(None, None, None)  # grants b, which has not run yet
        second.cancel()  # b leaves holding a granted slot it never used
        await asyncio.gather(second, return_exceptions=True)
        await asyncio.sleep(0.01)
        release.set()
        await third
        assert adm.in_flight("m") == 0 and adm.queued("m") == 0
        return order

    assert asyncio.run(main()) == ["a", "c"]


def test_limits_from_doc_are_tolerant_and_raising_a_limit_admits() -> None:
    """`models[].limits.concurrency` is read where valid and ignored otherwise; set_limits wakes waiters."""
    doc = {"version": 1, "models": [
        {"name": "a", "limits": {"concurrency": 2}}, {"name": "b", "limits": {"concurrency": 0}},
        {"name": "c", "limits": "x"}, {"name": "d"}, {"name": "e", "limits": {"concurrency": True}},
        {"name": "f", "limits": {"concurrency": "3"}}, {"name": "g", "limits": {"concurrency": -1}}]}
    assert RouteTable.from_doc(doc).limits == {"a": 2}
    assert RouteTable.from_doc({"version": 1}).limits == {}

    async def main() -> None:
        adm = admission.Admission(limits={"m": 1}, max_queue=5, max_wait_s=5)
        release, order = asyncio.Event(), []
        tasks = [asyncio.create_task(_hold(adm, "m", order, n, release=release)) for n in ("a", "b")]
        await asyncio.sleep(0)
        assert order == ["a"]
        adm.set_limits({"m": 2})
        await asyncio.sleep(0)
        assert order == ["a", "b"]
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
