"""The usage service's limits (from the store, never the router) and the webhook's signature, on real SQLite."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from pathlib import Path

import pytest

from llmgw.api.reports import BadReport
from llmgw.api.usage import QuotaItem, QuotaSync
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.tables import ApiKeyRow, ProjectRow
from llmgw.control.usage.config import usage_config
from llmgw.control.usage.service import UsageService
from llmgw.control.usage.webhook import signature
from llmgw.core import quota
from llmgw.core.errors import LlmgwError
from llmgw.serving.settings import ServerSettings


def test_limits_come_from_the_key_its_rpm_tpm_and_the_project(tmp_path: Path) -> None:
    store = store_mod.Store.open(tmp_path)
    with store._session.begin() as s:
        s.add(ProjectRow(name="team", limits={"spend_per_month": 2.5}, created_at=0.0))
        s.add(ApiKeyRow(id="k1", name="k1", sha256="1" * 64, created_at=0.0, rpm=7, tpm=900,
                        limits={"tokens_per_minute": 500, "concurrent_requests": 3}))
        s.add(ApiKeyRow(id="k2", name="k2", sha256="2" * 64, created_at=0.0, limits={"bogus": 1}))
    db = StoreThread(store)
    service = UsageService(db)

    async def main() -> None:
        now = time.time()
        items = tuple(QuotaItem(quota.budget_id(scope, kind, quota.period(kind, now).id), want=1)
                      for scope, kind in (("key:k1", "requests_per_minute"), ("key:k1", "tokens_per_minute"),
                                          ("key:k1", "concurrent_requests"), ("project:team", "spend_per_month"),
                                          ("key:k2", "tokens_per_day"), ("key:gone", "requests_per_day")))
        answer = await service.sync(QuotaSync("r1", items))
        # The key's own limits win over its tpm; spend is in micros; a limit the store cannot read is none.
        assert [g.limit for g in answer.items] == [7, 500, 3, 2_500_000, 0, 0]
        with pytest.raises(BadReport, match=r"^items\[0\]\.budget: "):
            await service.sync(QuotaSync("r1", (QuotaItem("key:k1/per_fortnight/x"),)))
        # A limit changed in the store is read at the next sync once invalidated (the table changed).
        with store._session.begin() as s:
            s.get(ApiKeyRow, "k1").limits = {"tokens_per_minute": 50}  # type: ignore[union-attr]
        service.invalidate()
        again = await service.sync(QuotaSync("r1", items[1:2]))
        assert again.items[0].limit == 50

    try:
        asyncio.run(main())
    finally:
        db.close()
        store.close()


def test_the_signature_is_the_hmac_of_the_exact_body() -> None:
    body = b'{"percent":80}'
    assert signature(b"k", body) == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()


def test_the_webhook_secret_is_read_from_its_file_never_the_command_line(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("abc\n")
    cfg = usage_config(ServerSettings(budget_webhook_url="https://hooks.example/x", budget_webhook_secret_file=secret))
    assert cfg.webhook_secret == b"abc" and "abc" not in repr(cfg)
    secret.write_text("")
    with pytest.raises(LlmgwError, match="--budget-webhook-secret-file .* the file is empty"):
        usage_config(ServerSettings(budget_webhook_secret_file=secret))
    with pytest.raises(ValueError, match="--budget-webhook-url 'ftp://x'"):
        ServerSettings(budget_webhook_url="ftp://x")
    assert not usage_config(ServerSettings()).request_log


def test_each_budget_in_force_is_exported_as_its_share_used_and_dropped_when_its_limit_goes(tmp_path: Path) -> None:
    """``llmgw_budget_used_ratio{scope,kind}`` (the 90 % alert's input): charged over limit as the last sync
    answered; a budget whose limit was removed leaves the scrape."""
    store = store_mod.Store.open(tmp_path)
    with store._session.begin() as s:
        s.add(ProjectRow(name="team", limits={"tokens_per_day": 1000}, created_at=0.0))
    db = StoreThread(store)
    service = UsageService(db)

    def ratio() -> float | None:
        return service.registry.get_sample_value("llmgw_budget_used_ratio",
                                                 {"scope": "project:team", "kind": "tokens_per_day"})

    async def main() -> None:
        budget = quota.budget_id("project:team", "tokens_per_day", quota.period("tokens_per_day", time.time()).id)
        await service.sync(QuotaSync("r1", (QuotaItem(budget, consumed=900),)))
        assert ratio() == pytest.approx(0.9)
        with store._session.begin() as s:
            s.get(ProjectRow, "team").limits = {}  # type: ignore[union-attr]
        service.invalidate()
        answer = await service.sync(QuotaSync("r1", (QuotaItem(budget),)))
        assert answer.items[0].limit == 0
        assert ratio() is None

    try:
        asyncio.run(main())
    finally:
        db.close()
        store.close()
