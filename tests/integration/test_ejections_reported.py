"""Ejections reach the control plane: a standalone router reports them, the replica shows them, /metrics counts.

(The last test drives the router's ``events.HttpSink`` alone, against a control plane that is down at first.)

The control plane runs in a thread of the test (the real REST app over a real
SQLite store, served by uvicorn on 127.0.0.1), so its router-event recorder can
be given a clock that stands still: an ejection lasts two seconds, and a busy
machine must not make the test race it. The router is a real standalone process
following that control plane; the replica's endpoint is a port nothing listens on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from aiohttp import web

from llmgw.control.auth import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.routerreports import RouterEvents
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.store.store import Store
from llmgw.core import specs
from llmgw.router import reports as events
from llmgw.testing.procs import Proc, free_port, wait_for

MANIFEST = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
            "spec": {"engine": "sim", "replicas": 1}}


class ControlPlane:
    """The REST API over a store holding one Ready replica whose engine is gone."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = Store.open(data_dir)
        self.store.put_model(specs.parse_manifest(MANIFEST))
        self.dead = f"http://127.0.0.1:{free_port()}"
        self.store.write_replicas(upserts=[ReplicaRecord(id="m-dead01", model="m", fingerprint="f", phase=Phase.READY,
                                                         api_key="", node_id="node1", endpoint=self.dead)])
        self.cluster = Cluster(self.store)
        self.frozen = time.time()
        self.events = RouterEvents(clock=lambda: self.frozen)
        app = create_api(self.store, self.cluster, auth=Auth.insecure(), router_events=self.events)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await self.cluster.table.publish()  # the table the router reads; no reconcile loop runs
            await self.server.serve()
        asyncio.run(main())

    def __enter__(self) -> ControlPlane:
        self.thread.start()
        wait_for(lambda: self._answers(), timeout=20, what="control plane listening")
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        # A long poll still open (the router's table watch) is answered now, not at its timeout.
        asyncio.run_coroutine_threadsafe(self.cluster.close(), self.loop).result(5)
        self.thread.join(10)
        self.store.close()


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path / "data") as cp:
        yield cp


@pytest.fixture
def router(tmp_path: Path, control: ControlPlane) -> Iterator[str]:
    port = free_port()
    proc = Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port", str(port),
                       "--control", control.url, "--router-id", "r1"], log_path=tmp_path / "router.log")
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/v1/models", timeout=30)
        yield url
    finally:
        proc.stop()


def _replica(control: ControlPlane) -> dict[str, Any]:
    (item,) = httpx.get(control.url + "/api/v1/replicas", timeout=5).json()["items"]
    return item


def test_router_reports_an_ejection_and_the_replica_shows_it(control: ControlPlane, router: str,
                                                             tmp_path: Path) -> None:
    """Three failed connects eject the replica; the control plane shows who ejected it and why, and counts it."""
    for _ in range(3):
        answer = httpx.post(router + "/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=10)
        assert answer.status_code == 502
    replica = wait_for(lambda: (r := _replica(control))["router_ejections"] and r, timeout=10,
                       what="the ejection reported")
    assert isinstance(replica, dict)
    (ejection,) = replica["router_ejections"]
    assert ejection["router"] == "r1" and ejection["failures"] == 3
    assert replica["message"].startswith("ejected by router r1 for 2s: 3 consecutive failures (last: ")

    # Wide, so the table does not wrap the message over several lines.
    cli = Proc.start([sys.executable, "-m", "llmgw", "get", "replicas", "--url", control.url],
                     env={**os.environ, "COLUMNS": "400"}, log_path=tmp_path / "cli.log")
    assert cli.popen.wait(60) == 0
    assert "ejected by router r1" in (tmp_path / "cli.log").read_text()

    metrics = httpx.get(control.url + "/metrics", timeout=5).text
    assert 'llmgw_router_reported_ejections_total{model="m",router="r1"} 1.0' in metrics


def test_ejection_is_shown_only_while_it_lasts(control: ControlPlane) -> None:
    """Past its backoff an ejection is no longer shown (the router tries the replica again)."""
    report = {"router": "r9", "events": [{"type": "ejected", "model": "m", "replica": "m-dead01", "for_s": 4,
                                          "failures": 3, "reason": "HTTP 503"}]}
    assert httpx.post(control.url + "/api/v1/router/events", json=report, timeout=5).json() == {"applied": 1}
    assert "ejected by router r9 for 4s" in _replica(control)["message"]
    control.frozen += 5
    assert _replica(control)["router_ejections"] == []


def test_bad_report_is_refused_naming_the_field(control: ControlPlane) -> None:
    """A report routers would not send is a 422 that names what is wrong."""
    answer = httpx.post(control.url + "/api/v1/router/events",
                        json={"router": "r1", "events": [{"type": "exploded", "model": "m", "replica": "x"}]},
                        timeout=5)
    assert answer.status_code == 422
    assert "events[0].type" in answer.json()["error"]["message"]


async def _until(test: Callable[[], object], what: str, *, timeout: float = 10.0) -> None:
    """Poll ``test`` on the loop until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        await asyncio.sleep(0.02)


def test_events_wait_out_a_control_plane_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Refused, then answered 503 three times: the sink keeps retrying the same batch and delivers it once, in order."""
    caplog.set_level(logging.WARNING, logger=events.__name__)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        port = free_port()
        refused: list[dict[str, Any]] = []  # reports answered 503: a control plane up but failing
        got: list[dict[str, Any]] = []  # reports accepted
        sink = events.HttpSink("r1", f"http://127.0.0.1:{port}", backoff_max_s=0.3)
        await sink.start()
        sink.ejected("m", "m-1", for_s=2.0, failures=3, reason="HTTP 503")
        sink.recovered("m", "m-1")

        async def receive(request: web.Request) -> web.Response:
            if len(refused) < 3:
                refused.append(await request.json())
                return web.json_response({"error": {"message": "store unavailable"}}, status=503)
            got.append(await request.json())
            return web.json_response({"applied": len(got[-1]["events"])})
        app = web.Application()
        app.router.add_post("/api/v1/router/events", receive)
        runner = web.AppRunner(app)
        try:
            # Nothing listens yet: the first attempt is refused, and said so (once).
            await _until(lambda: any("cannot report 2 router events" in r.getMessage() for r in caplog.records),
                         "a refused attempt")
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            # Without retries the events would wait for stop()'s last try: delivery must come first.
            await _until(lambda: sink.sent == 2, "delivery after three 503s")
        finally:
            await sink.stop()
            await runner.cleanup()
        return refused, got

    refused, got = asyncio.run(scenario())
    assert len(refused) == 3 and len(got) == 1
    for report in (*refused, *got):  # every attempt carried the whole backlog, oldest first
        assert report["router"] == "r1" and [e["type"] for e in report["events"]] == ["ejected", "recovered"]
    warned = [r.getMessage() for r in caplog.records if "router events" in r.getMessage()]
    assert len(warned) == 1, warned  # one warning for the whole outage, not one per attempt
