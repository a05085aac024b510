"""Refusals in floods counted in one audit row per address and minute; entries past the retention pruned."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmgw.control import auditprune
from llmgw.control.http import audit as audit_http
from llmgw.control.http import auditcount
from llmgw.control.http.errors import error_body, install
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store

COUNTED = re.compile(r"\A(\d+) refused logins? from (\S+) in the 60 s from ")


def _counted(rows: list[store_mod.AuditEntry]) -> int:
    return sum(int(m.group(1)) for r in rows if (m := COUNTED.match(r.detail)))


def _flood(tmp_path: Path, *, refusals: int, clock: list[float]) -> list[store_mod.AuditEntry]:
    """``refusals`` rate-limited logins (429, as the login route answers them) through the audit middleware."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    app = FastAPI()
    install(app)
    app.add_middleware(audit_http.AuditMiddleware, db=db,
                       counts=auditcount.RefusalCounts(db, clock=lambda: clock[0]))

    @app.post("/api/v1/login")
    async def limited(body: dict[str, str]) -> JSONResponse:  # reads the body, as the real route does
        return JSONResponse(error_body("too many failed logins from 10.0.0.9; try again in 299s",
                                       type_="rate_limit_error", code="too_many_logins"), status_code=429)

    async def drive() -> None:
        transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for i in range(refusals):
                if i == refusals // 2:
                    clock[0] += 61.0  # half of them in the next minute
                got = await c.post("/api/v1/login", json={"username": f"user{i % 7}", "password": "x"})
                assert got.status_code == 429
        await db.barrier()

    try:
        asyncio.run(drive())
        return store.list_audit()
    finally:
        db.close()
        store.close()


def test_a_thousand_rate_limited_logins_are_two_rows_that_count_them(tmp_path: Path) -> None:
    """1,000 refusals over two minutes: one row per minute, their counts adding up to 1,000, names shown."""
    rows = _flood(tmp_path, refusals=1000, clock=[1_800_000_000.0])
    assert len(rows) == 2, [r.detail for r in rows]
    assert _counted(rows) == 1000, [r.detail for r in rows]
    assert [r.detail.split(" ", 1)[0] for r in rows] == ["500", "500"]
    first = rows[0]
    assert (first.actor, first.action, first.object, first.outcome) == ("10.0.0.9", "login", "user/user0", "refused")
    assert "too_many_logins: too many failed logins" in first.detail
    assert "names tried: user0, user1, user2, user3, user4" in first.detail and "user5" not in first.detail


def test_one_refusal_is_one_row_saying_one(tmp_path: Path) -> None:
    """A lone refusal reads as one, not as a count that is wrong."""
    rows = _flood(tmp_path, refusals=1, clock=[1_800_000_000.0])
    assert len(rows) == 1 and rows[0].detail.startswith("1 refused login from 10.0.0.9 in the 60 s"), rows


def test_entries_past_the_retention_are_pruned_and_newer_kept(tmp_path: Path) -> None:
    """With 90 days' retention, entries 91 and 100 days old go; 89 days old and today's stay."""
    now, day = 1_800_000_000.0, 86400.0
    store = Store.open(tmp_path)
    try:
        for age in (100, 91, 89, 0):
            store.record_audit(actor="a", action="apply", object=f"model/m{age}", outcome="ok", at=now - age * day)
        assert auditprune.prune(store, retention_s=auditprune.DEFAULT_RETENTION_S, now=now) == 2
        assert [e.object for e in store.list_audit()] == ["model/m89", "model/m0"]
    finally:
        store.close()


def test_a_standby_prunes_nothing(tmp_path: Path) -> None:
    """Pruning is a leader's write, fenced as the others: a control plane without the lease deletes nothing."""
    store = Store.open(tmp_path)
    try:
        store.record_audit(actor="a", action="apply", object="model/old", outcome="ok", at=1.0)
        store.fence = store_mod.STANDBY
        assert auditprune.prune(store, retention_s=60.0, now=1_800_000_000.0) == 0
        store.fence = None
        assert [e.object for e in store.list_audit()] == ["model/old"]
    finally:
        store.close()


def test_the_leader_loop_prunes_and_a_standby_loop_does_not(tmp_path: Path) -> None:
    """``auditprune.run`` prunes on its first pass while leading, and not at all while standing by."""
    store = Store.open(tmp_path)
    db = StoreThread(store)

    async def one_pass(leading: bool) -> None:
        task = asyncio.create_task(auditprune.run(db, retention_s=3600.0, leading=lambda: leading,
                                                  clock=lambda: 1_800_000_000.0))
        await asyncio.sleep(0.2)
        task.cancel()
        await db.barrier()

    try:
        store.record_audit(actor="a", action="apply", object="model/old", outcome="ok", at=1.0)
        asyncio.run(one_pass(False))
        assert len(store.list_audit()) == 1
        asyncio.run(one_pass(True))
        assert store.list_audit() == []
    finally:
        db.close()
        store.close()


def test_the_prune_interval_follows_the_retention() -> None:
    """A tenth of the retention, at most hourly and at least every second."""
    assert auditprune.every_s(90 * 86400.0) == 3600.0
    assert auditprune.every_s(600.0) == 60.0
    assert auditprune.every_s(2.0) == 1.0
