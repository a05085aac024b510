"""The overview's router traffic in a real browser (Debian's Chromium): it refreshes itself while completions
go through the server's router, with no reload. Screenshots go to the test artifact folder."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

# Waits, not timings: a sim replica is Ready within a few seconds here; the margin is for a loaded CI machine.
LIVE_S = 45.0
MODEL = "busy"


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    """The module's system with a sim model Ready behind the router."""
    ui_system.apply(system.sim_model(MODEL))
    ui_system.wait_model(MODEL, timeout=LIVE_S)
    return ui_system


def test_traffic_appears_live_with_rate_ttft_and_errors(cluster: system.System, chrome: browser.Browser) -> None:
    """The open overview goes from "No requests yet" to a row for the model with a non-zero rate and a TTFT in
    ms, and an error under the unknown model, by itself (htmx every 2 s), after requests sent elsewhere."""
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    traffic = page.locator("#traffic")
    expect(traffic).to_contain_text("No requests yet")
    cluster.wait_router(MODEL, 1, timeout=LIVE_S)  # its probe requests count too: they are the router's traffic
    with httpx.Client(base_url=cluster.url, timeout=30, trust_env=False) as c:
        for _ in range(4):
            with c.stream("POST", "/v1/chat/completions", json={"model": MODEL, "stream": True, "max_tokens": 4,
                                                                "messages": [{"role": "user", "content": "hi"}]}) as r:
                r.read()
                assert r.status_code == 200
        assert c.post("/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
    row = page.locator(f'#traffic tr[data-traffic="{MODEL}"]')
    expect(row).to_be_visible(timeout=LIVE_S * 1000)
    expect(row.locator(".ttft-p50")).to_have_text(re.compile(r"\d ms$"))
    assert float(row.locator(".rate").inner_text()) > 0
    expect(page.locator('#traffic tr[data-traffic="(unknown model)"] .errors')).to_have_text("1")
    chrome.screenshot(page, "overview-traffic")
