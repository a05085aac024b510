"""The admin UI in a real browser: Debian's Chromium (llmgw/testing/browser.py) against a real ``llmgw server``,
a real agent (node1) and sim engines, as an operator meets it.

One system serves the module (its start is most of the time). Screenshots of each step go to the test
artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``), one folder per test, at 1280 px and
at a phone's 390 px.
"""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

# Waits, not timings: the overview refreshes its fragments every 2 s and a sim replica is Ready within a
# few seconds here (the whole file ran in 18-20 s); the margin is for a loaded CI machine, not a goal.
LIVE_S = 45.0


def _logged_in(page: sync_api.Page, ui_system: system.System) -> None:
    browser.log_in(page, username="admin", password=ui_system.admin_password)


def test_login_then_overview_shows_node_and_a_new_model_turning_ready_live(
        ui_system: system.System, chrome: browser.Browser) -> None:
    """Admin logs in through the form and lands on the overview: node1 Ready, the user's name and role shown,
    and a model applied through the REST API appears and turns Ready 1/1 with no reload of the page."""
    page = chrome.page(base_url=ui_system.url)
    page.goto("/ui/login")
    expect(page.locator("#login-form")).to_be_visible()
    expect(page).to_have_title(re.compile(r"^llmgw · "))
    chrome.screenshot(page, "login")

    _logged_in(page, ui_system)
    expect(page).to_have_title("llmgw · Overview")
    expect(page.locator("#user")).to_contain_text("admin")
    expect(page.locator('tr[data-node="node1"] .state')).to_have_text("Ready", timeout=LIVE_S * 1000)

    # A marker on the page's own window: a reload or a navigation would start a fresh window without it,
    # so finding it afterwards proves the new row came by the fragments' refresh, not by loading the page.
    page.evaluate("window.__llmgwNoReload = true")
    ui_system.apply(system.sim_model("chat-ui"))
    row = page.locator('tr[data-model="chat-ui"]')
    expect(row.locator(".ready")).to_have_text("1/1", timeout=LIVE_S * 1000)
    expect(row.locator(".state")).to_contain_text("Ready")
    assert page.evaluate("window.__llmgwNoReload === true"), "the overview was reloaded to show the new model"
    assert page.url.endswith("/ui/")
    chrome.screenshot(page, "overview")


def test_login_and_overview_fit_a_phone_width_screen(ui_system: system.System, chrome: browser.Browser) -> None:
    """At 390 px the login form and the overview are usable: nothing makes the page scroll sideways, and
    node1's row is there."""
    page = chrome.page(base_url=ui_system.url, viewport=browser.PHONE)
    page.goto("/ui/login")
    expect(page.locator("#login-form")).to_be_visible()
    chrome.screenshot(page, "login")
    assert page.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width

    _logged_in(page, ui_system)
    expect(page.locator('tr[data-node="node1"] .state')).to_have_text("Ready", timeout=LIVE_S * 1000)
    expect(page.locator("#logout")).to_be_visible()
    chrome.screenshot(page, "overview")
    # Wide tables scroll inside their own box; the page itself stays the screen's width.
    assert page.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width


def test_a_wrong_password_is_refused_in_words_and_the_overview_stays_closed(
        ui_system: system.System, chrome: browser.Browser) -> None:
    """Anonymous /ui/ goes to the login page; a wrong password shows #login-error as a sentence (no bare
    status code), sets no session, and the overview is still refused."""
    page = chrome.page(base_url=ui_system.url)
    page.goto("/ui/")
    assert page.url.endswith("/ui/login"), page.url

    browser.log_in(page, username="admin", password="not-the-password", lands=False)
    error = page.locator("#login-error")
    expect(error).to_be_visible()
    words = error.inner_text().strip()
    assert len(words.split()) >= 3, f"the refusal should be a sentence, got {words!r}"
    assert "401" not in words and "403" not in words, words
    chrome.screenshot(page, "bad-password")
    assert not [c for c in page.context.cookies() if c["name"] == "llmgw_session"]
    page.goto("/ui/")
    assert page.url.endswith("/ui/login"), page.url


def test_the_browser_helper_drives_chromium_against_the_server(ui_system: system.System,
                                                                chrome: browser.Browser) -> None:
    """The infrastructure itself: headless Chromium loads the server's own /api/docs page (no UI needed)
    and saves a screenshot per named step at each viewport."""
    for viewport in (browser.DESKTOP, browser.PHONE):
        page = chrome.page(base_url=ui_system.url, viewport=viewport)
        # The API reference is public and rendered on the server (no script, nothing from a CDN): no credential.
        page.goto("/api/docs", wait_until="domcontentloaded")
        expect(page).to_have_title("llmgw control plane reference")
        shot = chrome.screenshot(page, "api docs")
        assert shot == chrome.folder / f"api-docs-{viewport.width}.png"
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_test_still_closes_the_browser_and_leaves_a_failure_screenshot(tmp_path: Path) -> None:
    """When the body of ``chromium()`` raises, the open pages are photographed as failed-N and Chromium ends."""
    chromes: list[psutil.Process] = []
    with pytest.raises(RuntimeError, match="boom"), browser.chromium("fails", artifacts=tmp_path) as b:
        b.page().set_content("<title>t</title><p>before the failure</p>")
        # Playwright's driver is this process's child and Chromium the driver's: these are this test's own.
        chromes = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
        assert chromes
        raise RuntimeError("boom")
    assert (tmp_path / "fails" / "failed-0-1280.png").read_bytes()[:4] == b"\x89PNG"
    gone, alive = psutil.wait_procs(chromes, timeout=10)
    assert not alive, f"Chromium processes left running: {[p.pid for p in alive]}"
