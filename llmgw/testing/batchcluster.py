"""A router, the batch service and the sim engine in one process, for the batch tests (issue 32).

The real parts: the router app on its own HTTP server with the batch runner, the control plane's ``BatchService``
over a real store (SQLite in the test's directory, or a PostgreSQL URL), its ``/v1/files`` and ``/v1/batches``
app in front (as ``llmgw server`` dispatches them), and the sim engine, wrapped so that every request it answers
is counted by the line's ``custom_id`` (the prompt names it) with the body it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from llmgw.control.batches import http as batches_http
from llmgw.control.batches.config import FilesConfig
from llmgw.control.batches.service import BatchService
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.router import app as app_mod
from llmgw.router import server, table
from llmgw.sim.engine.app import Config, SimEngine
from llmgw.testing.procs import free_port

SECRET = "sk-batch-test"
OTHER = "sk-batch-other"


def line(custom_id: str, model: str = "m", url: str = "/v1/chat/completions") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": f"line {custom_id}"}], "max_tokens": 8}}


def jsonl(lines: list[Any]) -> bytes:
    """Lines as a file: bytes and strings as they are, anything else as JSON."""
    return b"\n".join(x if isinstance(x, bytes) else x.encode() if isinstance(x, str) else json.dumps(x).encode()
                      for x in lines) + b"\n"


class Engine:
    """The sim engine, counting each answered line by custom_id and keeping what it answered."""

    def __init__(self, **config: Any) -> None:
        self.sim = SimEngine(Config(model="m", echo=True, **config))
        self.count: Counter[str] = Counter()
        self.bodies: dict[str, Any] = {}
        self.gate: asyncio.Event | None = None  # set: answers flow; cleared: requests wait (a test holds them)

    @web.middleware
    async def _count(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        if self.gate is not None:
            await self.gate.wait()
        doc = await request.json()
        response = await handler(request)
        text = doc.get("messages", [{}])[-1].get("content", "") if isinstance(doc.get("messages"), list) else ""
        if text.startswith("line "):
            cid = text.removeprefix("line ")
            self.count[cid] += 1
            if isinstance(response, web.Response) and response.body is not None:
                self.bodies[cid] = json.loads(bytes(response.body))  # type: ignore[arg-type]
        return response

    def app(self) -> web.Application:
        app = self.sim.app()
        app.middlewares.insert(0, self._count)
        return app


def _table(engine_url: str, limit: int = 0, key_limits: dict[str, Any] | None = None,
           project_limits: dict[str, Any] | None = None) -> table.RouteTable:
    return table.RouteTable.from_doc({
        "version": 1,
        "models": [{"name": "m", "state": "Ready", "limits": {"concurrency_per_replica": limit},
                    "endpoints": [{"replica_id": "m-1", "url": engine_url, "node": "node-a"}]}],
        "auth": {"required": True, "keys": [
            {"id": "k1", "sha256": hashlib.sha256(SECRET.encode()).hexdigest(), "project": "team-a", "user": "ann",
             "limits": key_limits or {}},
            {"id": "k2", "sha256": hashlib.sha256(OTHER.encode()).hexdigest(), "project": "team-b"}],
                 "projects": [{"name": "team-a", "limits": project_limits}] if project_limits else []}})


class BatchCluster:
    def __init__(self, url: str, service: BatchService, router: app_mod.RouterApp, engine: Engine,
                 store: Store) -> None:
        self.url, self.service, self.router, self.engine, self.store = url, service, router, engine, store


def _keys(store: Store) -> None:
    from llmgw.control.store.credentials import StoredKey

    for project in ("team-a", "team-b"):
        if store.get_project(project) is None:
            store.create_project(project, now=0.0)
    for key_id, secret, project in (("k1", SECRET, "team-a"), ("k2", OTHER, "team-b")):
        store.add_key(StoredKey(id=key_id, name=key_id, sha256=hashlib.sha256(secret.encode()).hexdigest(),
                                project=project))


@contextlib.asynccontextmanager
async def batch_cluster(tmp: Path, *, url: str = "", concurrency: int = 4, step_s: float = 0.1,
                        engine: Engine | None = None, usage: Any = None, engine_url: str = "",
                        waiting_below: float = 1.0, limit: int = 0, quota: Any = None,
                        key_limits: dict[str, Any] | None = None,
                        project_limits: dict[str, Any] | None = None) -> AsyncIterator[BatchCluster]:
    """``engine_url``: an engine of the caller's (a sim process) instead of the counting one in process;
    ``limit``: the model's ``concurrency_per_replica`` (0: none); ``quota``: the router's budget service (a
    ``sim.ledger.SimLedger``'s ``sync``), with ``key_limits`` the limits of the key ``SECRET`` and
    ``project_limits`` its project's (team-a)."""
    engine = engine or Engine(decode_tps=5000, prefill_tps=10**6)
    runner = web.AppRunner(engine.app())
    await runner.setup()
    sim_port, port = free_port(), free_port()
    if not engine_url:
        await web.TCPSite(runner, "127.0.0.1", sim_port).start()
    store = Store.open_url(url) if url else Store.open(tmp)
    _keys(store)
    db = StoreThread(store)
    service = BatchService(db, FilesConfig(dir=None if url else tmp / "files", max_file_bytes=8 << 20,
                                           max_files_per_project=50))
    holder = table.TableHolder()
    holder.swap(_table(engine_url or f"http://127.0.0.1:{sim_port}", limit, key_limits, project_limits))
    router = app_mod.RouterApp(holder, batches=service, batch_concurrency=concurrency, router_id="r1",
                               batch_waiting_below=waiting_below, **({"quota": quota} if quota else {}),
                               **({"usage": usage, "usage_journal_dir": tmp / "journal"} if usage else {}))
    files = batches_http.create_app(service)

    async def front(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and batches_http.serves(scope["path"]):
            await files(scope, receive, send)
        else:
            await router(scope, receive, send)

    await router.startup()
    http = server.Server(front)
    await http.start("127.0.0.1", port)
    stepper = asyncio.create_task(service.run(lambda: True, interval_s=step_s))
    try:
        yield BatchCluster(f"http://127.0.0.1:{port}", service, router, engine, store)
    finally:
        stepper.cancel()
        await asyncio.gather(stepper, return_exceptions=True)
        await http.shutdown(1)
        await router.shutdown()
        await runner.cleanup()
        await asyncio.to_thread(db.close)
        store.close()
