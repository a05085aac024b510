"""Routers' usage and quota documents over the real REST API, and budget thresholds told once each.

The control plane's app is served on a free port of 127.0.0.1 with real authentication; the webhook's
receiver is a real HTTP server that refuses its first delivery with a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import httpx
import prometheus_client
from aiohttp import web

from llmgw.api.usage import QuotaItem, QuotaSync, UsageBatch, UsageRecord
from llmgw.control.auth import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.store import store as store_mod
from llmgw.control.store.credentials import StoredUser
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.tables import ApiKeyRow, ProjectRow
from llmgw.control.usage.config import UsageConfig
from llmgw.control.usage.service import UsageService
from llmgw.control.usage.webhook import SIGNATURE_HEADER, signature
from llmgw.core import quota
from llmgw.router import server as router_server
from llmgw.testing.procs import free_port

SECRET = b"s3cret-for-the-receiver"


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def seed(store: store_mod.Store) -> None:
    with store._session.begin() as s:  # rows as H1's project and key calls make them
        s.add(ProjectRow(name="team", limits={"tokens_per_day": 1000}, created_at=0.0))
        s.add(ApiKeyRow(id="k1", name="k1", sha256="0" * 64, created_at=0.0, project="team", rpm=5,
                        limits={"requests_per_day": 10}))


class Receiver:
    """A webhook receiver: the first delivery is answered 500, the rest 200 and kept."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, str]] = []
        self.refused = 0
        self.arrived = asyncio.Event()

    async def receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not self.refused:
            self.refused += 1
            return web.Response(status=500)
        self.got.append((body, request.headers.get(SIGNATURE_HEADER, "")))
        self.arrived.set()
        return web.Response(status=204)


@contextlib.asynccontextmanager
async def control(tmp_path: Path, cfg: UsageConfig = UsageConfig()) -> AsyncIterator[tuple[str, Auth, UsageService]]:
    store = store_mod.Store.open(tmp_path)
    seed(store)
    db = StoreThread(store)
    auth = Auth(db)
    service = UsageService(db, cfg, registry=prometheus_client.CollectorRegistry())
    app = create_api(db, Cluster(store), auth=auth, usage=service)
    http = router_server.Server(app)
    port = free_port()
    await http.start("127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}", auth, service
    finally:
        await http.shutdown(1)
        await service.close()
        db.close()
        store.close()


def test_rest_takes_a_routers_documents_and_refuses_users_and_bad_fields(tmp_path: Path) -> None:
    async def main() -> None:
        async with control(tmp_path) as (url, auth, _service):
            router_token, _ = await auth.issue(kind="router", subject="edge1")
            batch = UsageBatch("edge1", "j1", (UsageRecord(seq=1, at=1.8e9, project="team", key="k1", model="m",
                                                           prompt_tokens=7, completion_tokens=3, status=200),))
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                as_router = {"Authorization": f"Bearer {router_token}"}
                for _ in range(2):  # the same batch twice: stored once, acked the same
                    r = await c.post("/api/v1/router/usage", json=batch.to_doc(), headers=as_router)
                    assert r.status_code == 200 and r.json() == {"journal": "j1", "applied_through": 1}, r.text
                b = quota.budget_id("key:k1", "requests_per_day", quota.period("requests_per_day", 1.8e9).id)
                # The budget of today, whatever today is: the ledger only grants in the current period.
                today = quota.budget_id("key:k1", "requests_per_day",
                                        quota.period("requests_per_day", time.time()).id)
                r = await c.post("/api/v1/router/quota", headers=as_router,
                                 json=QuotaSync("edge1", (QuotaItem(today, want=3), QuotaItem(b, want=1))).to_doc())
                assert r.status_code == 200, r.text
                first, stale = r.json()["items"]
                assert (first["budget"], first["granted"], first["limit"]) == (today, 3, 10)
                assert stale["granted"] == 0
                # The limits from rpm and the project's come from the store, never from the router.
                r = await c.post("/api/v1/router/quota", headers=as_router, json={"router": "edge1", "items": [
                    {"budget": quota.budget_id("key:k1", "requests_per_minute",
                                               quota.period("requests_per_minute", time.time()).id),
                     "want": 100}]})
                assert r.json()["items"][0]["limit"] == 5
                # Bad documents: 422 naming the field.
                bad = batch.to_doc()
                bad["records"][0]["seq"] = -1
                for path, doc, field in (("/api/v1/router/usage", bad, "records[0].seq"),
                                         ("/api/v1/router/usage", {"router": "edge1", "records": []}, "journal"),
                                         ("/api/v1/router/quota", {"router": "edge1", "items": [{"budget": "x"}]},
                                          "items[0].budget"),
                                         ("/api/v1/router/quota", {"router": "edge1",
                                                                   "items": [{"budget": today, "want": -2}]},
                                          "items[0].want")):
                    r = await c.post(path, json=doc, headers=as_router)
                    assert r.status_code == 422, (path, r.text)
                    err = r.json()["error"]
                    assert err["message"].startswith(field) and err["param"] == field, err
                # A user's token, even an admin's, does not reach them; no token neither.
                await auth.db.call(auth.db.store.put_user, StoredUser("ada", "admin", "x", 0.0))
                user_token, _ = await auth.issue(kind="user", subject="ada")
                for path in ("/api/v1/router/usage", "/api/v1/router/quota"):
                    assert (await c.post(path, json={})).status_code == 401
                    r = await c.post(path, json=batch.to_doc(), headers={"Authorization": f"Bearer {user_token}"})
                    assert r.status_code == 403 and "only" in r.json()["error"]["message"], r.text
    run(main())


def test_thresholds_are_told_once_each_with_a_signed_webhook_retried_after_a_500(tmp_path: Path) -> None:
    async def main() -> None:
        receiver = Receiver()
        app = web.Application()
        app.router.add_post("/hook", receiver.receive)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        cfg = UsageConfig(webhook_url=f"http://127.0.0.1:{port}/hook", webhook_secret=SECRET)
        try:
            async with control(tmp_path, cfg) as (_url, _auth, service):
                service.thresholds.webhook._backoff = (0.05, 0.05)  # type: ignore[union-attr]
                b = quota.budget_id("project:team", "tokens_per_day", quota.period("tokens_per_day", time.time()).id)
                for consumed in (500, 350, 100, 200, 300):  # 50 %, 85 %, 95 %, 115 %, 145 %
                    await service.sync(QuotaSync("edge1", (QuotaItem(b, consumed=consumed),)))
                await service.thresholds.webhook.drain()  # type: ignore[union-attr]
                got = [json.loads(body) for body, _ in receiver.got]
                assert [(d["percent"], d["used"], d["limit"], d["project"]) for d in got] == \
                    [(80, 850, 1000, "team"), (100, 1150, 1000, "team")]
                assert all(sig == signature(SECRET, body) for body, sig in receiver.got)
                assert receiver.refused == 1  # the first 80 % delivery, tried again
                events = await service.db.call(service.db.store.list_events, obj="project/team")
                assert [(e.reason, e.kind) for e in events] == [("BudgetThreshold", "Normal"),
                                                                ("BudgetThreshold", "Warning")]
                assert "reached 100% of its tokens_per_day budget: 1150 of 1000 used" in events[1].message
                audit = [a for a in await service.db.call(service.db.store.list_audit)
                         if a.action == "budget threshold"]
                assert [a.object for a in audit] == [b, b]
                metric = prometheus_client.generate_latest(service.registry).decode()
                for pct in (80, 100):
                    assert (f'llmgw_budget_threshold_total{{kind="tokens_per_day",percent="{pct}",'
                            f'scope_kind="project"}} 1.0') in metric
        finally:
            await runner.cleanup()
    run(main())

