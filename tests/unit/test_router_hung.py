"""Giving up waits on a hung replica: which tables and ejections cancel which waits (plain asyncio, no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmgw.router import hung
from llmgw.router.table import RouteTable, TableError, TableHolder


def table(version: int, endpoints: list[str], unhealthy: list[str] = ()) -> RouteTable:  # type: ignore[assignment]
    return RouteTable.from_doc({"version": version, "models": [{
        "name": "m", "endpoints": [{"replica_id": r, "url": f"http://h/{r}"} for r in endpoints],
        "unhealthy": [{"replica_id": r, "reason": "health probe failed 1/3"} for r in unhealthy]}]})


async def _wait_on(waits: hung.Waits, replica: str, gate: asyncio.Event) -> str:
    try:
        with waits.waiting(replica):
            await gate.wait()
    except hung.Abandoned as e:
        return f"abandoned: {e}"
    return "answered"


def test_a_replica_listed_unhealthy_has_its_waits_given_up_and_others_keep_theirs() -> None:
    """A table listing b unhealthy ends b's waits with Abandoned; a's wait and a drained c's wait go on."""
    async def main() -> None:
        waits, holder, gate = hung.Waits(), TableHolder(), asyncio.Event()
        holder.listen(waits.follow)
        holder.swap(table(1, ["a", "b", "c"]))
        tasks = {r: asyncio.create_task(_wait_on(waits, r, gate)) for r in ("a", "b", "c")}
        await asyncio.sleep(0)
        holder.swap(table(2, ["a"], unhealthy=["b"]))  # c left too: drained, so it keeps its request
        got_b = await tasks["b"]
        assert got_b.startswith("abandoned: its engine stopped answering (health probe failed 1/3)")
        assert not tasks["a"].done() and not tasks["c"].done()
        gate.set()
        assert await tasks["a"] == "answered" and await tasks["c"] == "answered"
        # A new attempt on a replica listed now fails at once rather than waiting.
        with pytest.raises(hung.Abandoned), waits.waiting("b"):
            pass
        assert waits.among(["a", "b"]) == {"b"}

    asyncio.run(main())


def test_a_client_that_leaves_still_cancels_its_request() -> None:
    """Cancelled by its client as well as abandoned: the CancelledError wins, nothing is re-sent."""
    async def main() -> None:
        waits, gate = hung.Waits(), asyncio.Event()
        task = asyncio.create_task(_wait_on(waits, "b", gate))
        await asyncio.sleep(0)
        task.cancel()  # the client left
        assert waits.abandon("b", "ejected by this router") == 1
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_an_ejection_gives_up_only_the_waits_of_that_moment() -> None:
    """``abandon`` (a router's own ejection) cancels current waits; a later attempt there may wait again."""
    async def main() -> None:
        waits, gate = hung.Waits(), asyncio.Event()
        first = asyncio.create_task(_wait_on(waits, "b", gate))
        await asyncio.sleep(0)
        assert waits.abandon("b", "ejected by this router (HTTP 503)") == 1
        assert await first == "abandoned: ejected by this router (HTTP 503)"
        second = asyncio.create_task(_wait_on(waits, "b", gate))
        await asyncio.sleep(0)
        gate.set()
        assert await second == "answered"
        assert waits.abandon("b", "again") == 0  # nothing waits: nothing to say

    asyncio.run(main())


@pytest.mark.parametrize("bad,where", [({"unhealthy": {}}, "models[0].unhealthy"),
                                       ({"unhealthy": [{"reason": "x"}]}, "models[0].unhealthy[0].replica_id")])
def test_a_malformed_unhealthy_list_is_refused_naming_the_field(bad: dict[str, Any], where: str) -> None:
    """The table is refused (the last good one kept) rather than misread."""
    with pytest.raises(TableError, match=where.replace("[", r"\[").replace("]", r"\]")):
        RouteTable.from_doc({"version": 1, "models": [{"name": "m", **bad}]})
