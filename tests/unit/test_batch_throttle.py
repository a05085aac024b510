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
        await queued  # the queue drained: room again
        assert gate.queued("m") == 0 and runner.open_for(route)
        await waiter.__aexit__(None, None, None)
        runner._running["m"] = 2  # two lines of this router running: its own concurrency is spent
        assert not runner.open_for(route)

    asyncio.run(main())
