"""Two routers, one control plane's usage service over a real store (SQLite and PostgreSQL): the key's
requests-per-day budget holds across both, every refusal is a 429, and the stored rollups equal the
engine's usage of the served requests exactly.

The routers are real ``RouterApp`` s on their own HTTP servers with the sim engine behind them; they
reach ``UsageService`` through its two coroutines, as the in-process router does (a standalone one
POSTs the same documents to ``control.http.routerusage``).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from aiohttp import web

from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.tables import ApiKeyRow, ProjectRow
from llmgw.control.store.usagetables import UsageRollupRow
from llmgw.control.usage.service import UsageService
from llmgw.router import app as app_mod
from llmgw.router import server, table
from llmgw.sim.engine.app import Config, SimEngine
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import free_port

SECRET = "sk-usage-e2e"
LIMIT = 20
_names = itertools.count(1)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return store_mod.sqlite_url(tmp_path)
    found: Postgres = request.getfixturevalue("pg")
    return found.create_database(f"e{next(_names)}")


def _table(sim: str) -> table.RouteTable:
    return table.RouteTable.from_doc({
        "version": 1,
        "models": [{"name": "m", "state": "Ready", "endpoints": [{"replica_id": "m-1", "url": sim, "node": "n1"}]}],
        "auth": {"required": True,
                 "keys": [{"id": "k1", "sha256": hashlib.sha256(SECRET.encode()).hexdigest(), "project": "team",
                           "limits": {"requests_per_day": LIMIT}}],
                 "projects": [{"name": "team", "limits": {"tokens_per_day": 10_000_000}}]}})


def test_two_routers_hold_the_budget_and_store_usage_exactly(url: str, tmp_path: Path) -> None:
    store = store_mod.Store.open_url(url)
    with store._session.begin() as s:
        s.add(ProjectRow(name="team", limits={"tokens_per_day": 10_000_000}, created_at=0.0))
        s.add(ApiKeyRow(id="k1", name="k1", sha256=hashlib.sha256(SECRET.encode()).hexdigest(), created_at=0.0,
                        project="team", limits={"requests_per_day": LIMIT}))
    db = StoreThread(store)

    async def main() -> None:
        service = UsageService(db)
        runner = web.AppRunner(SimEngine(Config(model="m", decode_tps=5000, prefill_tps=10**6)).app())
        await runner.setup()
        sim_port = free_port()
        await web.TCPSite(runner, "127.0.0.1", sim_port).start()
        routers, servers, urls = [], [], []
        for n in range(2):
            holder = table.TableHolder()
            holder.swap(_table(f"http://127.0.0.1:{sim_port}"))
            app = app_mod.RouterApp(holder, quota=service.sync, usage=service.ingest,
                                    usage_journal_dir=tmp_path / f"j{n}", router_id=f"r{n}")
            await app.startup()
            http = server.Server(app)
            port = free_port()
            await http.start("127.0.0.1", port)
            routers.append(app)
            servers.append(http)
            urls.append(f"http://127.0.0.1:{port}")
        try:
            async with httpx.AsyncClient(timeout=30) as c:
                async def one(i: int) -> httpx.Response:
                    return await c.post(urls[i % 2] + "/v1/completions", headers={"Authorization": f"Bearer {SECRET}"},
                                        json={"model": "m", "prompt": f"hello {i}", "max_tokens": 4})
                answers = await asyncio.gather(*(one(i) for i in range(60)))
            served = [a for a in answers if a.status_code == 200]
            refused = [a for a in answers if a.status_code != 200]
            assert len(served) <= LIMIT, len(served)
            assert served and all(a.status_code == 429 and "retry-after" in a.headers for a in refused)
            for app in routers:
                assert app.journal is not None
                await app.journal.flush()
            want = (len(served), sum(a.json()["usage"]["prompt_tokens"] for a in served),
                    sum(a.json()["usage"]["completion_tokens"] for a in served))
            with store.engine.connect() as conn:
                got = conn.execute(sa.select(sa.func.sum(UsageRollupRow.requests),
                                             sa.func.sum(UsageRollupRow.prompt_tokens),
                                             sa.func.sum(UsageRollupRow.completion_tokens))
                                   .where(UsageRollupRow.grain == "d", UsageRollupRow.key == "k1")).one()
            # What was served, stored once: requests and the engine's tokens exactly.
            assert tuple(int(v or 0) for v in got) == want, (got, want)
        finally:
            for app, http in zip(routers, servers, strict=True):
                await http.shutdown(1)
                await app.shutdown()
            await runner.cleanup()
            await service.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        db.close()
        store.close()
