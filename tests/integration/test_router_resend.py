"""The router's forwarder against real sockets: requests waiting on a hung engine are re-sent, a drained one's are not.

The engines are two small HTTP servers on 127.0.0.1 written here: one answers at
once, the other reads each request and answers only when the test lets it (an
engine stopped with ``kill -STOP`` answers never; the kernel still accepts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from llmgw.router import upstream
from llmgw.router.table import RouteTable, TableHolder


class Engine:
    """An HTTP/1.1 server answering every POST with ``{"from": name}``, once ``gate`` is set."""

    def __init__(self, name: str, *, answers: bool, fails: bool = False) -> None:
        self.name = name
        self.fails = fails  # answers 503 at once to a body asking to "fail"
        self.gate = asyncio.Event()
        if answers:
            self.gate.set()
        self.received = 0
        self.dropped = 0  # connections the client closed before an answer
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                body = await reader.readexactly(length)
                if self.fails and b'"fail"' in body:  # what an overloaded engine answers at once
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                self.received += 1
                if not self.gate.is_set():
                    gate = asyncio.ensure_future(self.gate.wait())
                    gone = asyncio.ensure_future(reader.read(1))  # b"" once the client closed
                    done, _ = await asyncio.wait((gate, gone), return_when=asyncio.FIRST_COMPLETED)
                    if gone in done:
                        gate.cancel()
                        self.dropped += 1
                        return
                    gone.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await gone
                body = json.dumps({"from": self.name}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


def doc(version: int, endpoints: list[Engine], unhealthy: list[Engine] = ()) -> RouteTable:  # type: ignore[assignment]
    return RouteTable.from_doc({"version": version, "models": [{
        "name": "m", "routing": "round_robin",
        "endpoints": [{"replica_id": e.name, "url": e.url} for e in endpoints],
        "unhealthy": [{"replica_id": e.name, "reason": "health probe failed 1/3: timed out"} for e in unhealthy]}]})


async def _ask(fwd: upstream.Forwarder, holder: TableHolder, body: bytes = b'{"model": "m"}') -> str:
    route = holder.current.lookup("m")
    assert route is not None
    _, response = await fwd.open(route, "/v1/completions", body)
    try:
        return str(json.loads(await response.read())["from"])
    finally:
        response.close()


async def _until(check: Any, what: str) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


@contextlib.asynccontextmanager
async def _routed(*engines: Engine) -> AsyncIterator[tuple[TableHolder, upstream.Forwarder]]:
    """The engines started and in the table (version 1) of a started forwarder; all closed after, whatever failed."""
    try:
        for e in engines:
            await e.start()
        holder = TableHolder()
        holder.swap(doc(1, list(engines)))
        fwd = upstream.Forwarder(holder=holder, scrape_interval_s=3600)
        await fwd.start()
        try:
            yield holder, fwd
        finally:
            await fwd.close()
    finally:
        for e in engines:
            await e.stop()


def test_requests_waiting_on_a_replica_listed_unhealthy_are_answered_by_another() -> None:
    """Requests that reached the hung engine and got no byte are answered by the other replica; none fails."""
    async def main() -> None:
        hung_one, good = Engine("hung", answers=False), Engine("good", answers=True)
        async with _routed(hung_one, good) as (holder, fwd):
            asks = [asyncio.create_task(_ask(fwd, holder)) for _ in range(6)]
            await _until(lambda: hung_one.received >= 3, "three requests reached the hung engine")
            # Awaited, not asserted at that instant: under load (CI) the good engine's answers may still
            # be on their way when the hung one has its three (seen: "assert 0 == 3").
            await _until(lambda: sum(t.done() for t in asks) == 3, "the good one answered its share")
            assert sum(t.done() for t in asks) == 3  # and the hung one's three still wait
            holder.swap(doc(2, [good], unhealthy=[hung_one]))
            got = await asyncio.wait_for(asyncio.gather(*asks), 10)
            assert got == ["good"] * 6
            await _until(lambda: hung_one.dropped == 3, "the hung engine's connections dropped")

    asyncio.run(main())


def test_requests_on_a_replica_that_leaves_the_table_drained_finish_there() -> None:
    """A replica simply gone from the endpoints (drained) keeps its requests: they are answered by it, not re-sent."""
    async def main() -> None:
        slow, good = Engine("slow", answers=False), Engine("good", answers=True)
        async with _routed(slow, good) as (holder, fwd):
            asks = [asyncio.create_task(_ask(fwd, holder)) for _ in range(4)]
            await _until(lambda: slow.received >= 2, "two requests reached the slow engine")
            holder.swap(doc(2, [good]))
            assert await _ask(fwd, holder) == "good"  # a round trip after the swap, and they still wait
            assert sum(t.done() for t in asks) == 2
            slow.gate.set()
            assert sorted(await asyncio.wait_for(asyncio.gather(*asks), 10)) == ["good", "good", "slow", "slow"]
            assert slow.dropped == 0

    asyncio.run(main())


def test_requests_waiting_on_a_replica_this_router_ejects_are_answered_by_another() -> None:
    """The router's own ejection (503s in a row) gives up the requests waiting there for a first byte."""
    async def main() -> None:
        flaky, good = Engine("flaky", answers=False, fails=True), Engine("good", answers=True)
        async with _routed(flaky, good) as (holder, fwd):
            asks = [asyncio.create_task(_ask(fwd, holder)) for _ in range(4)]
            await _until(lambda: flaky.received >= 2, "two requests waiting on the flaky engine")
            # Each 503 is retried on the good one (so these succeed) and counts toward the ejection.
            while not fwd.outliers.is_ejected("flaky"):
                assert await _ask(fwd, holder, b'{"model": "m", "prompt": "fail"}') == "good"
            assert await asyncio.wait_for(asyncio.gather(*asks), 10) == ["good"] * 4
            await _until(lambda: flaky.dropped == 2, "the flaky engine's waiting connections dropped")

    asyncio.run(main())
