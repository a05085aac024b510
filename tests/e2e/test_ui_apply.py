"""The spec editor and replica logs in a real browser: Debian's Chromium (llmgw/testing/browser.py) against a
real ``llmgw server``, agent (node1) and sim engine, as an operator applies a model from the UI.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``), one folder
per test, at 1280 px and at a phone's 390 px.
"""

from __future__ import annotations

import re

import pytest
import yaml
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

# Waits, not timings: the model page refreshes every 2 s and a sim replica is Ready within seconds here;
# the margin is for a loaded CI machine, not a goal.
LIVE_S = 45.0


def _logged_in(page: sync_api.Page, ui_system: system.System) -> None:
    browser.log_in(page, username="admin", password=ui_system.admin_password)


def test_apply_from_the_editor_then_the_replica_turns_ready_live_and_its_log_has_lines(
        ui_system: system.System, chrome: browser.Browser) -> None:
    """Admin opens /ui/apply, types a sim model's YAML, applies: the model page shows its replica row turn Ready
    with no reload, and the replica's Logs link shows the engine's lines in #replica-log."""
    page = chrome.page(base_url=ui_system.url)
    _logged_in(page, ui_system)
    page.goto("/ui/apply")
    expect(page).to_have_title("llmgw · Apply a model")
    editor = page.locator("#spec-editor")
    editor.fill("")
    editor.press_sequentially(yaml.safe_dump(system.sim_model("sim-typed"), sort_keys=False))
    chrome.screenshot(page, "editor")
    page.locator("#apply-button").click()
    page.wait_for_url("**/ui/models/sim-typed")
    expect(page).to_have_title("llmgw · Model sim-typed")
    # Marked on the page's window: a reload would start a fresh one, so the Ready row came by htmx's refresh.
    page.evaluate("window.__llmgwNoReload = true")
    row = page.locator("tr[data-replica]").first
    expect(row.locator(".phase")).to_have_text("Ready", timeout=LIVE_S * 1000)
    assert page.evaluate("window.__llmgwNoReload === true"), "the model page was reloaded to show the replica"
    chrome.screenshot(page, "model")
    phone = chrome.page(base_url=ui_system.url, viewport=browser.PHONE)
    _logged_in(phone, ui_system)      # a context of its own, so a session of its own
    phone.goto("/ui/models/sim-typed")
    expect(phone.locator("tr[data-replica] .phase").first).to_have_text("Ready", timeout=LIVE_S * 1000)
    chrome.screenshot(phone, "model")
    assert phone.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width

    row.locator("a.logs").click()
    page.wait_for_url(re.compile(r".*/ui/models/sim-typed/replicas/[^/]+/logs$"))
    expect(page.locator("#replica-log")).not_to_be_empty(timeout=LIVE_S * 1000)
    chrome.screenshot(page, "replica log")


def test_a_manifest_the_api_refuses_is_shown_in_words_and_the_text_is_kept(
        ui_system: system.System, chrome: browser.Browser) -> None:
    """Applying replicas: many shows #editor-error as the API's sentence and the editor still holds the text."""
    page = chrome.page(base_url=ui_system.url)
    _logged_in(page, ui_system)
    page.goto("/ui/apply")
    text = yaml.safe_dump(system.sim_model("sim-bad", replicas="many"), sort_keys=False)
    page.locator("#spec-editor").fill(text)
    page.locator("#apply-button").click()
    error = page.locator("#editor-error")
    expect(error).to_contain_text("replicas")
    assert len(error.inner_text().split()) >= 3 and "422" not in error.inner_text()
    assert page.locator("#spec-editor").input_value() == text
    chrome.screenshot(page, "refused")
