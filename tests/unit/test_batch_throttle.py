"""The batch runner's throttle (issue 32): a line starts only while its model's admission queue is empty, its
engines report fewer waiting than the threshold and fewer than ``concurrency`` lines run here.

The real ``Admission`` (a request made to queue behind a full slot) and the real ``Loads`` (as a scrape leaves it).
"""

from __future__ import annotations

import asyncio

from llmgw.router import admission, table
from llmgw.router.batchrun import BatchRunner
from llmgw.router.loadwatch import EngineLoad, Loads


def _route() -> table.ModelRoute:
    t = table.RouteTable.from_doc({"version": 1, "models": [{"name": "m", "state": "Ready", "endpoints": [
        {"replica_id": "m-1", "url": "http://127.0.0.1:9", "node": "n"}]}]})
    route = t.lookup("m")
    assert route is not None
    return route


def _runner(gate: admission.Admission, loads: Loads) -> BatchRunner:
    return BatchRunner("r1", None, table.TableHolder(), admission_=gate, loads=loads, proxy=None,  # type: ignore[arg-type]
                       meter=None, concurrency=2, waiting_below=2.0)


def test_lines_start_only_while_interactive_requests_leave_room() -> None:
    async def main() -> None:
        gate = admission.Admission(limits={"m": 1})
        loads = Loads()
        runner, route = _runner(gate, loads), _route()
        assert runner.open_for(route)
        loads.engine["m-1"] = EngineLoad(waiting=2.0)  # the engine's own queue at the threshold
        assert not runner.open_for(route)
        loads.engine["m-1"] = EngineLoad(waiting=1.0)
        assert runner.open_for(route)
        waiter = gate.slot("m")
        async with gate.slot("m"):  # the one slot taken by an interactive request, a second one queued
            queued = asyncio.create_task(waiter.__aenter__())
            await asyncio.sleep(0)
            assert gate.queued("m") == 1
            assert not runner.open_for(route)
        await queued  # the queue drained, but the model's one slot is taken
        assert gate.queued("m") == 0 and not runner.open_for(route)
        await waiter.__aexit__(None, None, None)
        assert runner.open_for(route)  # room again
        runner._running["m"] = 2  # two lines of this router running: its own concurrency is spent
        assert not runner.open_for(route)

    asyncio.run(main())


def test_lines_leave_a_quarter_of_the_models_slots_to_interactive_requests() -> None:
    async def main() -> None:
        gate = admission.Admission(limits={"m": 8})
        runner, route = _runner(gate, Loads()), _route()
        runner.concurrency = 100
        held = [gate.slot("m") for _ in range(7)]
        for n, slot in enumerate(held):  # 0..5 in flight: room; 6 of 8: the last 2 are kept
            assert runner.open_for(route) == (n < 6), n
            await slot.__aenter__()
        assert gate.in_flight("m") == 7 and not runner.open_for(route)
        for slot in held:
            await slot.__aexit__(None, None, None)
        # Lines this runner started that do not hold their slot yet count too: started in one pass, they would
        # otherwise all see the slots free and take the whole model.
        runner._unslotted["m"] = 5
        assert runner.open_for(route)
        runner._unslotted["m"] = 6
        assert not runner.open_for(route)
        one = admission.Admission(limits={"m": 1})
        runner = _runner(one, Loads())
        assert runner.open_for(route)  # an idle model with one slot still runs a line
        async with one.slot("m"):
            assert not runner.open_for(route)

    asyncio.run(main())
