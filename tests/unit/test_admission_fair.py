"""Admission with classes and projects (issue 32): the fair queue inside the real ``Admission``, its bounds kept,
and the table's wire for classes and weights."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.api import routing
from llmgw.core.queueclasses import Classes, QueueAs
from llmgw.router import admission
from llmgw.router.auth import Authenticator

LIGHT = QueueAs(flow="project:light", project="light")
HEAVY = QueueAs(flow="project:heavy", project="heavy")
BATCH = QueueAs(klass="batch", rank=1, flow="project:heavy", project="heavy")


async def _order(adm: admission.Admission, waiters: list[tuple[str, QueueAs, int]]) -> list[str]:
    order: list[str] = []
    release = asyncio.Event()

    async def hold() -> None:
        async with adm.slot("m"):
            await release.wait()

    async def one(name: str, queue_as: QueueAs, priority: int) -> None:
        async with adm.slot("m", priority=priority, queue_as=queue_as):
            order.append(name)
            await asyncio.sleep(0)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    tasks = []
    for name, queue_as, priority in waiters:
        tasks.append(asyncio.create_task(one(name, queue_as, priority)))
        await asyncio.sleep(0)
    assert adm.queued("m") == len(waiters)
    release.set()
    await asyncio.gather(holder, *tasks)
    assert adm.in_flight("m") == 0 and adm.queued("m") == 0
    return order


def test_projects_share_a_class_and_batch_waits_for_it() -> None:
    waiters = [*((f"h{i}", HEAVY, 0) for i in range(4)), ("b", BATCH, 0), ("l0", LIGHT, 0), ("l1", LIGHT, 0)]
    fair = asyncio.run(_order(admission.Admission(default_limit=1, max_wait_s=5), waiters))
    assert fair == ["h0", "l0", "h1", "l1", "h2", "h3", "b"]
    fifo = asyncio.run(_order(admission.Admission(default_limit=1, max_wait_s=5, fair=False), waiters))
    assert fifo == ["h0", "h1", "h2", "h3", "l0", "l1", "b"]


def test_the_keys_integer_priority_orders_within_a_class_not_across() -> None:
    waiters = [("batch-high", BATCH, 9), ("low", HEAVY, 0), ("high", LIGHT, 5)]
    assert asyncio.run(_order(admission.Admission(default_limit=1, max_wait_s=5), waiters)) == [
        "high", "low", "batch-high"]


def test_a_waiter_that_gives_up_loses_no_slot_and_the_bounds_hold() -> None:
    async def main() -> None:
        adm = admission.Admission(default_limit=1, max_queue=2, max_wait_s=0.05)
        release = asyncio.Event()

        async def hold() -> None:
            async with adm.slot("m"):
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        with pytest.raises(admission.Overloaded):  # the wait runs out
            async with adm.slot("m", queue_as=LIGHT):
                pass
        assert adm.queued("m") == 0
        adm.max_wait_s = 5
        waiting = [asyncio.create_task(_enter(adm, q)) for q in (HEAVY, LIGHT)]
        await asyncio.sleep(0)
        with pytest.raises(admission.Overloaded):  # the queue is full
            async with adm.slot("m", queue_as=BATCH):
                pass
        release.set()
        await asyncio.gather(holder, *waiting)
        assert adm.in_flight("m") == 0 and adm.queued("m") == 0
        async with adm.slot("m"):  # the slot the timed-out waiter held a place for is not lost
            assert adm.in_flight("m") == 1

    asyncio.run(main())


async def _enter(adm: admission.Admission, queue_as: QueueAs) -> None:
    async with adm.slot("m", queue_as=queue_as):
        await asyncio.sleep(0)


def test_the_table_carries_classes_and_weights_and_reads_them_tolerantly() -> None:
    doc = routing.AuthDoc(required=True, keys=(
        routing.KeyEntry("k1", "a" * 64, project="team", priority_class="batch", weight=2.0),
        routing.KeyEntry("k2", "b" * 64, project="team")),
        projects=(routing.ProjectEntry("team", priority_class="premium", weight=3.0),),
        priority_classes=("premium", "interactive", "batch"))
    wire = doc.to_doc()
    assert wire["priority_classes"] == ["premium", "interactive", "batch"]
    assert "priority_class" not in wire["keys"][1] and "weight" not in wire["keys"][1]  # unset: not sent
    assert routing.AuthDoc.from_doc(wire) == doc
    auth = Authenticator.from_doc(wire)
    assert auth.classes == Classes(("premium", "interactive", "batch"))
    own, by_project = auth.by_hash["a" * 64].queue_as, auth.by_hash["b" * 64].queue_as
    assert (own.klass, own.rank, own.flow, own.weight) == ("batch", 2, "key:k1", 2.0)
    assert (by_project.klass, by_project.rank, by_project.flow, by_project.weight) == ("premium", 0, "project:team",
                                                                                       3.0)
    # A malformed class list, class or weight (a newer or broken control plane) is left out, not the table.
    wire["priority_classes"] = ["batch", "interactive"]
    wire["keys"][0].update(priority_class="Not A Class", weight=-3)
    read = routing.AuthDoc.from_doc(wire)
    assert read.priority_classes == ("interactive", "batch")
    assert (read.keys[0].priority_class, read.keys[0].weight) == ("", 0.0) and read.keys[0].sha256 == "a" * 64
    # A table without any of it (0.2.0's) is the defaults.
    assert Authenticator.from_doc({"required": True, "keys": [{"id": "k", "sha256": "c" * 64}]}).by_hash[
        "c" * 64].queue_as == QueueAs(flow="key:k", project="default")
