"""Stand-in control planes for tests: an AgentService for agents, and the routers' side of the REST API.

``serve`` runs any AgentService servicer on a loopback port (agent tests). ``RouterControl`` serves what a
router reads and posts: the ``EndpointsDoc`` with the real long poll (``GET /api/v1/endpoints`` held while
``after`` is the current version), the load reports (``POST /api/v1/router/signals``), the events, and the
usage and quota services over an in-memory ledger (``router.ledger``), on a loop in a thread of its own, so
tests driving a router process stay synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from aiohttp import web

from llmgw.api import usage as wire
from llmgw.api.routing import EndpointsDoc
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.router.ledger import Ledger
from llmgw.testing.procs import free_port


def serve(servicer: agent_pb2_grpc.AgentServiceServicer, port: int, ready: threading.Event,
          stop: threading.Event) -> None:
    """Serve ``servicer`` on 127.0.0.1:``port`` (plaintext gRPC); set ``ready`` once listening, return after ``stop``.

    Meant as a thread's target, so a test's own code stays synchronous.
    """

    async def main() -> None:
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await asyncio.to_thread(stop.wait)
        await server.stop(0)

    asyncio.run(main())


class RouterControl:
    """The control plane as routers see it, serving ``doc``: an ``EndpointsDoc``, or a dict sent as it is (a
    document a router must refuse can be served too).

    ``start()`` serves (again, after ``stop()``, on the same port); ``set_doc`` publishes a new table and answers
    the polls held; ``close()`` ends the thread. What it saw: ``polls``, ``queries`` ((after, timeout) of each
    poll), ``held`` (polls held open now) and ``reports`` (the load reports, as posted). With
    ``refuse_signals`` a load report is answered 500 (counted in ``refused``), as a control plane in trouble.
    Usage and quota syncs go to ``ledger`` (its limits: ``limits``); ``stored_by_router`` counts the usage records
    stored per router id, and ``authorizations`` holds each ``Authorization`` header a caller gave.
    """

    def __init__(self, doc: EndpointsDoc | Mapping[str, Any], *, port: int | None = None,
                 limits: dict[tuple[str, str], int] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.doc: EndpointsDoc | Mapping[str, Any] = doc
        self.polls = 0
        self.queries: list[tuple[int, float]] = []
        self.held = 0
        self.reports: list[dict[str, Any]] = []
        #: The router events posted (``RouterReport``'s ``events``: ejections, recoveries, keys used), in order.
        self.events: list[dict[str, Any]] = []
        self.refuse_signals = False
        #: The headers the table's answers carry: this release's protocol (``core.skew``); a test acting as an
        #: older control plane sets {} (0.1.0 sent none).
        self.said: dict[str, str] = skew.headers(skew.PROTOCOL, "0.0.0-fake")
        #: What each poll said of its router: (protocol header, version header), "" where absent.
        self.routers_said: list[tuple[str, str]] = []
        self.refused = 0
        self.ledger = Ledger(limits)
        self.stored_by_router: dict[str, int] = {}
        self.authorizations: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._changed: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None

    @property
    def version(self) -> object:
        return self.doc.version if isinstance(self.doc, EndpointsDoc) else self.doc.get("version")

    async def _endpoints(self, request: web.Request) -> web.Response:
        self.authorizations.add(request.headers.get("Authorization", ""))
        self.routers_said.append((request.headers.get(skew.PROTOCOL_HEADER, ""),
                                  request.headers.get(skew.VERSION_HEADER, "")))
        self.polls += 1
        assert self._changed is not None
        after, timeout = int(request.query.get("after", "-1")), float(request.query.get("timeout", "30"))
        self.queries.append((after, timeout))
        if self.version == after:
            self.held += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._changed.wait()), timeout)
            finally:
                self.held -= 1
        return web.json_response(self.doc.to_doc() if isinstance(self.doc, EndpointsDoc) else self.doc,
                                 headers=self.said)

    async def _signals(self, request: web.Request) -> web.Response:
        doc = await request.json()
        if self.refuse_signals:
            self.refused += 1
            return web.json_response({"error": "store unavailable"}, status=500)
        self.reports.append(doc)
        return web.json_response({"applied": len(doc["models"])})

    async def _usage(self, request: web.Request) -> web.Response:
        self.authorizations.add(request.headers.get("Authorization", ""))
        batch = wire.UsageBatch.from_doc(await request.json())
        before = self.ledger.stored
        ack = await self.ledger.ingest(batch)
        self.stored_by_router[batch.router_id] = (self.stored_by_router.get(batch.router_id, 0)
                                                  + self.ledger.stored - before)
        return web.json_response(ack.to_doc())

    async def _quota(self, request: web.Request) -> web.Response:
        self.authorizations.add(request.headers.get("Authorization", ""))
        return web.json_response((await self.ledger.sync(wire.QuotaSync.from_doc(await request.json()))).to_doc())

    async def _events(self, request: web.Request) -> web.Response:
        doc = await request.json()
        self.events.extend(doc.get("events", []))
        return web.json_response({"applied": len(doc.get("events", []))})

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    async def _start(self) -> None:
        self._changed = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/v1/endpoints", self._endpoints)
        app.router.add_post("/api/v1/router/signals", self._signals)
        app.router.add_post(wire.USAGE_PATH, self._usage)
        app.router.add_post(wire.QUOTA_PATH, self._quota)
        app.router.add_post("/api/v1/router/events", self._events)
        # A short shutdown: a stopped control plane drops the polls it holds instead of answering them.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def start(self) -> RouterControl:
        if not self._thread.is_alive():
            self._thread.start()
        self._call(self._start)
        return self

    def set_doc(self, doc: EndpointsDoc | Mapping[str, Any]) -> None:
        """Publishes ``doc``: every poll held answers with it now."""
        def swap() -> None:
            assert self._changed is not None
            self.doc = doc
            self._changed.set()
            self._changed = asyncio.Event()
        self._call(swap)

    def stop(self) -> None:
        """Stops serving (the port closes); ``start()`` serves again."""
        if self._runner is not None:
            self._call(self._runner.cleanup)
            self._runner = None

    def close(self) -> None:
        self.stop()
        if self._thread.is_alive():
            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._loop.close()
