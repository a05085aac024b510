"""The Keys page in a real browser (Debian's Chromium, llmgw/testing/browser.py) against a real ``llmgw server``, an
agent and a sim engine: a key made on the page is shown once with a working copy button, answers the ``openai``
client through the server's router, shows when it was last used, and once disabled on the page gets that client
a 401; enabled again, it answers again.

Screenshots of each step go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``).
"""

from __future__ import annotations

import re

import openai
import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, system
from llmgw.testing.procs import wait_for

pytestmark = pytest.mark.slow

MODEL = "sim-keys-ui"
# Waits, not timings: a key reaches the router with the next table (about a second here) and its use comes
# back within a report interval; the margin is for a loaded CI machine.
LIVE_S = 30.0


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    """The module's system (tests/e2e/conftest.py) with one Ready sim model the router serves."""
    ui_system.apply(system.sim_model(MODEL))
    ui_system.wait_model(MODEL)
    ui_system.wait_router(MODEL, 1)
    return ui_system


def _chat(cluster: system.System, secret: str) -> str:
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    try:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return out.choices[0].message.content or ""
    finally:
        client.close()


def _answer(cluster: system.System, secret: str) -> str | None:
    """The model's answer with ``secret``, or None while the router refuses it (401)."""
    try:
        return _chat(cluster, secret) or "(empty answer)"
    except openai.AuthenticationError:
        return None


def _refusal(cluster: system.System, secret: str) -> openai.AuthenticationError | None:
    try:
        _chat(cluster, secret)
    except openai.AuthenticationError as e:
        return e
    return None


def _accepting_confirms(page: sync_api.Page) -> None:
    # Playwright dismisses dialogs by default, which is a person pressing Cancel: the form would not post.
    page.on("dialog", lambda dialog: dialog.accept())


def test_key_created_on_the_page_is_used_then_disabled_and_the_client_gets_401(
        cluster: system.System, chrome: browser.Browser) -> None:
    """Create a key in the form (secret shown once, copy button puts it on the clipboard), use it from the openai
    client, see "last used" change from never, disable it on the page and see the client get 401, enable it
    and see it answer again."""
    page = chrome.page(base_url=cluster.url)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=cluster.url)
    _accepting_confirms(page)
    browser.log_in(page, username="admin", password=cluster.admin_password)

    page.get_by_role("navigation").get_by_role("link", name="Keys").click()
    expect(page).to_have_title("llmgw · Keys")
    create = page.locator("#create-key")
    create.get_by_label("Name").fill("from-browser")
    create.get_by_label("Models").fill(MODEL)
    create.get_by_label("Requests a minute").fill("120")
    create.get_by_role("button", name="Create key").click()

    secret = page.locator("#new-key-secret").inner_text().strip()
    assert secret.startswith("llmgw-")
    expect(page.locator("#new-key")).to_contain_text("will not be shown again")
    page.locator("#copy-key").click()
    expect(page.locator("#copy-key")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    chrome.screenshot(page, "created")
    (key,) = [k for k in cluster.get("/api/v1/keys")["items"] if k["name"] == "from-browser"]
    row = page.locator(f'tr[data-key="{key["id"]}"]')
    expect(row.locator(".models")).to_have_text(MODEL)
    expect(row.locator(".rpm")).to_have_text("120")
    expect(row.locator(".last-used")).to_have_text("never")

    # Shown once: the list loaded again carries no secret.
    page.goto("/ui/keys")
    expect(page.locator("#new-key")).to_have_count(0)
    assert secret not in page.content()

    answer = wait_for(lambda: _answer(cluster, secret), timeout=LIVE_S, interval=0.2, what="the new key accepted")
    assert answer

    def last_used() -> str | None:
        page.reload()
        text = row.locator(".last-used").inner_text()
        return text if re.fullmatch(r"\d+s ago", text) else None

    wait_for(last_used, timeout=LIVE_S, interval=0.5, what="last used shown")
    chrome.screenshot(page, "used")

    row.get_by_role("button", name="Disable").click()
    expect(row.locator(".state")).to_have_text("disabled")
    expect(row.get_by_role("button", name="Enable")).to_be_visible()
    refused = wait_for(lambda: _refusal(cluster, secret), timeout=LIVE_S, interval=0.2,
                       what="the disabled key refused")
    assert refused.status_code == 401 and "not valid" in str(refused.message)
    chrome.screenshot(page, "disabled")

    row.get_by_role("button", name="Enable").click()
    expect(row.locator(".state")).to_have_text("enabled")
    assert wait_for(lambda: _answer(cluster, secret), timeout=LIVE_S, interval=0.2, what="the enabled key accepted")

    phone = chrome.page(viewport=browser.PHONE, base_url=cluster.url)
    phone.context.add_cookies(page.context.cookies())
    phone.goto("/ui/keys")
    expect(phone.locator(f'tr[data-key="{key["id"]}"]')).to_be_visible()
    chrome.screenshot(phone, "keys")


def test_a_refusal_on_the_page_is_in_words(cluster: system.System, chrome: browser.Browser) -> None:
    """A limit the API refuses (a priority past 1000) is shown on the page as the API's sentence naming the field."""
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.goto("/ui/keys")
    create = page.locator("#create-key")
    create.get_by_label("Name").fill("too-eager")
    # The browser's own min/max check would stop the post before the API sees it; a person with an old
    # page (or a script) gets past it, and the API's answer must still read as a sentence.
    page.evaluate("document.getElementById('key-priority').removeAttribute('max')")
    create.get_by_label("Priority").fill("5000")
    create.get_by_role("button", name="Create key").click()
    error = page.locator("#keys-error")
    expect(error).to_contain_text("priority")
    expect(error).not_to_contain_text("422")
    chrome.screenshot(page, "refused")
