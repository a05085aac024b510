"""The audit log's parts: the store's table, how a request becomes a row, and the CLI's table."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from llmgw.cli import audit as audit_cli
from llmgw.cli import client as client_mod
from llmgw.control.auth import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.http import audit as audit_http
from llmgw.control.http.api import create_api
from llmgw.control.http.errors import ApiError, install
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def test_store_records_and_lists_audit_in_order(tmp_path: Path) -> None:
    """Entries come back oldest first with their ids; ``since_id`` and ``limit`` page through them."""
    store = Store.open(tmp_path)
    try:
        a = store.record_audit(actor="alice@127.0.0.1", action="apply", object="model/m", outcome="ok", at=1.0)
        b = store.record_audit(actor="bob@10.0.0.2", action="delete", object="model/m", outcome="refused",
                               detail="model 'm' does not exist", at=2.0)
        c = store.record_audit(actor="10.0.0.3", action="cordon", object="node/n1", outcome="failed", at=3.0)
        assert a.id < b.id < c.id
        assert store.list_audit() == [a, b, c]
        assert store.list_audit(since_id=a.id) == [b, c]
        assert store.list_audit(since_id=a.id, limit=1) == [b]
        assert store.list_audit(since_id=c.id) == []
        assert b.detail == "model 'm' does not exist" and b.outcome == "refused" and b.at == 2.0
    finally:
        store.close()


def test_store_refuses_an_unknown_outcome(tmp_path: Path) -> None:
    """An outcome other than ok/refused/failed is a bug in the caller, refused rather than stored."""
    store = Store.open(tmp_path)
    try:
        with pytest.raises(ValueError, match="expected one of ok, refused, failed"):
            store.record_audit(actor="a", action="apply", object="model/m", outcome="maybe")
        assert store.list_audit() == []
    finally:
        store.close()


def test_every_mutating_route_is_audited_or_says_why_not(tmp_path: Path) -> None:
    """Each POST/PUT/PATCH/DELETE route of the REST app matches an audited route or is listed with a reason."""
    store = Store.open(tmp_path)
    app = create_api(store, Cluster(store), auth=Auth.insecure())
    try:
        # From the OpenAPI document: ``app.routes`` holds included routers whole, not their routes.
        routes = [(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops
                  if m.upper() in MUTATING]
        assert routes, "no mutating routes found: the enumeration is broken"
        for method, path in routes:
            concrete = path.replace("{name}", "x").replace("{node_id}", "n1").replace("{key_id}", "key-1")
            assert audit_http.audited(method, concrete) or (method, path) in audit_http.NOT_AUDITED, (method, path)
        assert audit_http.audited("GET", "/api/v1/models") is None
        assert audit_http.audited("POST", "/api/v1/models/x/cordon") is None
    finally:
        store.close()


def test_actor_joins_the_claim_and_the_peer_and_strips_forgery() -> None:
    """``claim@peer``; a claim cannot carry spaces or newlines into the log, and without one the peer alone."""
    assert audit_http.actor("alice", "127.0.0.1") == "alice@127.0.0.1"
    assert audit_http.actor("sudo:bob", "10.0.0.2") == "sudo:bob@10.0.0.2"
    assert audit_http.actor("", "10.0.0.2") == "10.0.0.2"
    assert audit_http.actor("eve\nok admin", "10.0.0.9") == "eveokadmin@10.0.0.9"
    assert audit_http.actor("x" * 500, "") == "x" * 64 + "@unknown"


def test_object_comes_from_the_path_the_body_name_or_the_answer_id_never_more() -> None:
    """The object names what was changed; a key's secret in the answer is not part of it."""
    put = audit_http.audited("PUT", "/api/v1/models/m1")
    post = audit_http.audited("POST", "/api/v1/models")
    key = audit_http.audited("POST", "/api/v1/keys")
    assert put and post and key
    assert audit_http.object_of(put, "/api/v1/models/m1", b"", b"") == "model/m1"
    body = json.dumps({"metadata": {"name": "m2"}, "spec": {"env": {"TOKEN": "hunter2"}}}).encode()
    assert audit_http.object_of(post, "/api/v1/models", body, b"") == "model/m2"
    assert audit_http.object_of(post, "/api/v1/models", b"not json", b"") == "model/?"
    answer = json.dumps({"id": "key-abc", "key": "llmgw-secret"}).encode()
    assert audit_http.object_of(key, "/api/v1/keys", b"", answer) == "key/key-abc"


def test_outcome_and_refusal_from_the_status_and_error_shape() -> None:
    """2xx is ok, 4xx refused with the error's message, 5xx failed; a 2xx answer's body is never the detail."""
    assert [audit_http.outcome_of(s) for s in (200, 201, 404, 422, 500, 503)] == \
        ["ok", "ok", "refused", "refused", "failed", "failed"]
    err = json.dumps({"error": {"message": "spec.replicas: must be >= 0", "code": "invalid_spec"}}).encode()
    assert audit_http.refusal_of(422, err) == "spec.replicas: must be >= 0"
    assert audit_http.refusal_of(502, b"<html>") == "answered 502"
    assert audit_http.refusal_of(201, b'{"key": "llmgw-secret"}') == ""


def test_cli_table_has_the_columns_and_a_row_per_entry() -> None:
    """``llmgw audit`` prints TIME, ACTOR, ACTION, OBJECT, OUTCOME, DETAIL, one row each, ``-`` for no detail."""
    items = [{"id": 1, "at": 0.0, "actor": "alice@127.0.0.1", "action": "apply", "object": "model/m",
              "outcome": "ok", "detail": ""},
             {"id": 2, "at": 0.0, "actor": "bob@127.0.0.1", "action": "cordon", "object": "node/n9",
              "outcome": "refused", "detail": "node 'n9' is not known"}]
    lines = audit_cli.rows_text(items, []).splitlines()
    header = lines[0]
    for col in audit_cli.COLUMNS:
        assert col in header
    assert [header.index(c) for c in audit_cli.COLUMNS] == sorted(header.index(c) for c in audit_cli.COLUMNS)
    first = next(ln for ln in lines if "alice@127.0.0.1" in ln)
    assert first.split()[2:] == ["alice@127.0.0.1", "apply", "model/m", "ok", "-"]  # after the date and time
    second = next(ln for ln in lines if "bob@127.0.0.1" in ln)
    assert "refused" in second and "node 'n9' is not known" in second
    assert audit_cli.row(items[0])[-1] == "-"


def test_local_actor_names_the_sudo_invoker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under sudo the CLI claims ``sudo:<invoking user>``, not root; otherwise the local user."""
    monkeypatch.setenv("SUDO_USER", "carol")
    assert client_mod.local_actor() == "sudo:carol"
    monkeypatch.delenv("SUDO_USER")
    monkeypatch.setenv("USER", "dave")
    monkeypatch.setenv("LOGNAME", "dave")
    assert client_mod.local_actor() == "dave"


def test_middleware_records_a_crash_as_failed_and_a_refusal_with_its_message(tmp_path: Path) -> None:
    """A handler that raises is a failed row; a 404 is refused with its message; a GET is not recorded."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    app = FastAPI()
    install(app)
    app.add_middleware(audit_http.AuditMiddleware, db=db)

    @app.delete("/api/v1/models/{name}")
    async def crash(name: str) -> None:
        raise RuntimeError("disk on fire")

    @app.post("/api/v1/nodes/{node_id}/cordon")
    async def missing(node_id: str) -> None:
        raise ApiError(404, f"node {node_id!r} is not known", code="node_not_found")

    @app.get("/api/v1/models")
    async def listing() -> dict[str, list[str]]:
        return {"items": []}

    async def drive() -> None:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=("10.0.0.7", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            assert (await c.delete("/api/v1/models/m", headers={"X-Llmgw-Actor": "erin"})).status_code == 500
            assert (await c.post("/api/v1/nodes/n9/cordon")).status_code == 404
            assert (await c.get("/api/v1/models")).status_code == 200
        await db.barrier()

    try:
        asyncio.run(drive())
        rows = store.list_audit()
    finally:
        db.close()
        store.close()
    assert [(r.actor, r.action, r.object, r.outcome) for r in rows] == \
        [("erin@10.0.0.7", "delete", "model/m", "failed"), ("10.0.0.7", "cordon", "node/n9", "refused")]
    assert "RuntimeError" in rows[0].detail and "disk on fire" not in rows[0].detail
    assert rows[1].detail == "node 'n9' is not known"


def test_a_deposed_leader_still_records_what_it_did_and_a_standby_records_nothing(tmp_path: Path) -> None:
    """An audit entry is history, not state: a leader deposed between its change and the entry saying so (paused
    past its lease) still records it, where its state writes are fenced; a standby writes no entry at all."""
    from llmgw.control.store import store as store_mod
    from llmgw.control.store.base import Fenced

    a, b = Store.open(tmp_path), Store.open(tmp_path)
    try:
        taken = a.take_lease("a", now=a.db_now(), lease_s=0.01)
        assert taken is not None
        a.fence = ("a", taken.term)
        a.put_settings({"k": "1"})  # under its lease
        time.sleep(0.05)
        by_b = b.take_lease("b", now=b.db_now(), lease_s=60.0)
        assert by_b is not None and by_b.term == taken.term + 1  # a is deposed
        with pytest.raises(Fenced):
            a.put_settings({"k": "2"})
        a.record_audit(actor="user/admin", action="settings", object="setting/k", outcome="ok")
        b.fence = store_mod.STANDBY
        with pytest.raises(Fenced, match="standby"):
            b.record_audit(actor="user/admin", action="settings", object="setting/k", outcome="ok")
        assert [(e.object, e.outcome) for e in a.list_audit()] == [("setting/k", "ok")]
        assert a.settings()["k"] == "1"
    finally:
        a.close()
        b.close()
