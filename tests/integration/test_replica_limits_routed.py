"""Per-replica concurrency limits end to end: a router process over two sim engines allowing one request each.

A full replica is never picked; when both are full a request waits in the
model's admission queue, is served as soon as one frees, and past the wait gets
429 with Retry-After. The sims' ``/sim/stats`` say what each engine ran.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.api.routing import LoadReport
from llmgw.router import signals
from llmgw.router.app import RouterApp
from llmgw.router.table import RouteTable, TableHolder
from llmgw.testing.procs import wait_for
from llmgw.testing.routed import Procs, started


class Limited:
    """Sims that decode 20 tokens/s, behind a router allowing one request per replica."""

    def __init__(self, procs: Procs) -> None:
        self.p = procs

    def sim(self) -> str:
        return self.p.sim("m", "--decode-tps", "20")

    def router(self, sims: list[str], *, wait_s: float) -> str:
        return self.p.router([{"name": "m", "state": "Ready", "routing": "round_robin",
                               "limits": {"concurrency_per_replica": 1},
                               "endpoints": [{"replica_id": f"m-{i}", "url": u} for i, u in enumerate(sims)]}],
                             "--admission-wait", str(wait_s))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Limited]:
    with started(tmp_path) as p:
        yield Limited(p)


LONG = {"model": "m", "prompt": "x", "max_tokens": 400, "stream": True}  # 20 s unless cut
SHORT = {"model": "m", "prompt": "x", "max_tokens": 2}


def _running(sim: str) -> int:
    return int(httpx.get(sim + "/sim/stats", timeout=5).json()["running"])


@contextlib.contextmanager
def _streams(client: httpx.Client, router: str, n: int) -> Iterator[list[httpx.Response]]:
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(client.stream("POST", router + "/v1/completions", json=LONG))
                  for _ in range(n)]
        # Kept: an iterator dropped mid-stream is finalized, and that closes its response.
        readers = [response.iter_bytes() for response in opened]
        for response, reader in zip(opened, readers, strict=True):
            assert response.status_code == 200
            next(reader)  # the first token: the engine is generating it
        yield opened


def test_full_replicas_are_skipped_and_then_the_queue_answers_429(procs: Limited) -> None:
    """Two streams take one replica each (never both on one); a third request waits, then gets 429 + Retry-After."""
    sims = [procs.sim(), procs.sim()]
    router = procs.router(sims, wait_s=1.0)
    with httpx.Client(timeout=30) as client, _streams(client, router, 2) as opened:
        assert sorted(r.headers["x-llmgw-upstream"] for r in opened) == ["m-0", "m-1"]
        assert [_running(s) for s in sims] == [1, 1]
        refused = client.post(router + "/v1/completions", json=SHORT)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "model_overloaded"
        assert [_running(s) for s in sims] == [1, 1]  # nothing was sent to a full replica


def test_a_waiting_request_is_served_when_a_replica_frees(procs: Limited) -> None:
    """With both replicas full a request waits in the queue, and the replica that frees serves it."""
    sims = [procs.sim(), procs.sim()]
    router = procs.router(sims, wait_s=30.0)
    with httpx.Client(timeout=30) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with _streams(client, router, 2) as opened:
            waiting = pool.submit(client.post, router + "/v1/completions", json=SHORT)
            wait_for(lambda: "llmgw_router_queued_requests 1.0" in httpx.get(router + "/metrics").text
                     or waiting.done(), timeout=10, what="the third request queued")
            assert not waiting.done()
            freed = opened[0].headers["x-llmgw-upstream"]
            opened[0].close()
            answer = waiting.result(timeout=20)
            assert answer.status_code == 200
            assert answer.headers["x-llmgw-upstream"] == freed


def test_a_burst_never_puts_more_than_the_limit_on_a_replica(procs: Limited) -> None:
    """Twenty concurrent requests over two replicas limited to one each: no engine ever holds two; all succeed."""
    sims = [procs.sim(), procs.sim()]
    router = procs.router(sims, wait_s=60.0)
    body = {"model": "m", "prompt": "x", "max_tokens": 3, "stream": True}
    with httpx.Client(timeout=60) as client, concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: client.post(router + "/v1/completions", json=body), range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    stats = [httpx.get(s + "/sim/stats", timeout=5).json() for s in sims]
    assert [s["peak_inside"] for s in stats] == [1, 1]
    assert sum(s["completed"] for s in stats) == 20


def test_a_request_admitted_by_a_new_replica_is_sent_to_it_not_refused(procs: Limited) -> None:
    """A request waits while the only replica is full; a table adding a second replica admits it at once, to that one.

    The slot it is given is the new replica's (the model's limit is per endpoint): picked among
    the endpoints of the table it arrived with, it found them all full and got a 429 (seen in
    bench/autoscale.py as a scale-up's replicas turned Ready). And the new limit applies when the
    table arrives, not when the next request does.
    """
    sims = [procs.sim(), procs.sim()]

    def table(n: int) -> RouteTable:
        return RouteTable.from_doc({"version": n, "models": [
            {"name": "m", "state": "Ready", "routing": "round_robin", "limits": {"concurrency_per_replica": 1},
             "endpoints": [{"replica_id": f"m-{i}", "url": u} for i, u in enumerate(sims[:n])]}]})

    async def scenario() -> tuple[int, str, str]:
        holder = TableHolder(table(1))
        app = RouterApp(holder, admission_wait_s=30.0)
        await app.startup()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=30) as client:
                first = asyncio.ensure_future(client.post("/v1/completions", json={**SHORT, "max_tokens": 40}))
                await _until(lambda: app._admission.in_flight("m") == 1)
                second = asyncio.ensure_future(client.post("/v1/completions", json=SHORT))
                await _until(lambda: app._admission.queued("m") == 1)
                holder.swap(table(2))  # the scale-up's replica is Ready: the limit goes from 1 to 2
                answer = await second
                # Admitted when the table came, not when the first request ended: it did not wait on.
                assert not first.done()
                done = await first
                return answer.status_code, answer.headers.get("x-llmgw-upstream", answer.text), \
                    done.headers.get("x-llmgw-upstream", "")
        finally:
            await app.shutdown()

    status, upstream, first_upstream = asyncio.run(scenario())
    assert first_upstream == "m-0"
    assert (status, upstream) == (200, "m-1")


def test_a_queue_that_forms_is_reported_to_the_autoscaler_at_once(procs: Limited) -> None:
    """The first request to wait in a model's admission queue sends a load report now, not an interval later."""
    sim = procs.sim()
    delivered: list[LoadReport] = []

    async def scenario() -> None:
        holder = TableHolder(RouteTable.from_doc({"version": 1, "models": [
            {"name": "m", "state": "Ready", "routing": "round_robin", "limits": {"concurrency_per_replica": 1},
             "endpoints": [{"replica_id": "m-0", "url": sim}]}]}))
        reporter = signals.Reporter("r1", deliver=delivered.append, interval_s=3600)
        app = RouterApp(holder, admission_wait_s=30.0, signals=reporter)
        await app.startup()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=30) as client:
                first = asyncio.ensure_future(client.post("/v1/completions", json={**SHORT, "max_tokens": 40}))
                await _until(lambda: app._admission.in_flight("m") == 1)
                assert delivered == []  # a request admitted at once is no queue
                second = asyncio.ensure_future(client.post("/v1/completions", json=SHORT))
                await _until(lambda: bool(delivered))
                assert not first.done()  # sent while the queue stands, not when it drained
                assert [e.waiting for e in delivered[0].models if e.model == "m"] == [1]
                assert (await first).status_code == 200 and (await second).status_code == 200
        finally:
            await app.shutdown()

    asyncio.run(scenario())


async def _until(ready: Callable[[], bool]) -> None:
    for _ in range(3000):
        if ready():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the router never reached the state the test waits for")
