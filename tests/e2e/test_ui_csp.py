"""The UI in Chromium under its Content-Security-Policy: every page opens with no refusal on the console, htmx
still refreshes the overview, and what inline handlers did (the keys page's Copy, the confirm before a
delete) is done by ``static/ui.js``.

The ``chrome`` fixture fails any test whose pages broke the policy (``browser.CspViolation``); these tests
walk every page so a violation anywhere is seen, and check that the policy is really in force (an inline
script added to a page is refused), so a quiet console means something.
"""

from __future__ import annotations

from playwright.sync_api import expect

from llmgw.testing import browser, system

PAGES = ("/ui/", "/ui/models", "/ui/nodes", "/ui/nodes/node1", "/ui/keys", "/ui/playground", "/ui/apply", "/ui/deploy",
         "/ui/audit", "/ui/users", "/ui/models/no-such-model")


def test_every_page_opens_under_the_policy_and_htmx_refreshes(ui_system: system.System,
                                                               chrome: browser.Browser) -> None:
    """Each page in turn, no CSP refusal on the console; the overview's nodes part is fetched again by htmx every
    2 s (its config read from the meta tag, not a script); an inline script put into the page does not run."""
    page = chrome.page(base_url=ui_system.url)
    browser.log_in(page, username="admin", password=ui_system.admin_password)
    for path in PAGES:
        page.goto(path)
        expect(page.locator("main")).to_be_visible()
    page.goto("/ui/")
    with page.expect_response(lambda r: "/ui/fragments/nodes" in r.url, timeout=15_000) as refreshed:
        pass
    assert refreshed.value.status == 200
    assert page.evaluate("htmx.config.allowEval") is False
    assert page.evaluate("htmx.config.includeIndicatorStyles") is False
    expect(page.locator('tr[data-node="node1"]')).to_be_visible()
    # The policy is in force: a script injected as markup is refused (and reported, so this test expects it).
    with page.expect_console_message(lambda m: "Content Security Policy" in m.text, timeout=10_000):
        page.evaluate("""() => { const d = document.createElement('div');
            d.innerHTML = '<img src=x onerror="window.ran = 1">'; document.body.appendChild(d); }""")
    assert page.evaluate("window.ran") is None
    assert any("Content Security Policy" in v for v in chrome.csp_violations), chrome.csp_violations
    chrome.csp_violations.clear()


def test_copy_and_confirm_work_from_the_static_script(ui_system: system.System, chrome: browser.Browser) -> None:
    """A key made on the keys page: Copy puts it on the clipboard; Delete asks first, and Cancel keeps it, OK
    deletes it; a user's delete asks the same way."""
    page = chrome.page(base_url=ui_system.url)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=ui_system.url)
    browser.log_in(page, username="admin", password=ui_system.admin_password)
    page.goto("/ui/keys")
    create = page.locator("#create-key")
    create.get_by_label("Name").fill("csp-key")
    create.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-secret").inner_text().strip()
    page.locator("#copy-key").click()
    expect(page.locator("#copy-key")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret

    (key,) = [k for k in ui_system.get("/api/v1/keys")["items"] if k["name"] == "csp-key"]
    row = page.locator(f'tr[data-key="{key["id"]}"]')
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    row.get_by_role("button", name="Delete").click()
    expect(row).to_be_visible()
    assert asked and "Delete key csp-key" in asked[0], asked
    assert [k for k in ui_system.get("/api/v1/keys")["items"] if k["name"] == "csp-key"]
    page.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name="Delete").click()
    expect(row).to_have_count(0)

    page.goto("/ui/users")
    made = page.locator("#create-user")
    made.get_by_label("Name").fill("csp-user")
    made.get_by_role("button", name="Create user").click()
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.locator('form[action$="/users/csp-user/delete"]').get_by_role("button").click()
    page.wait_for_url("**/ui/users")
    assert "Delete user csp-user" in asked[-1], asked
    assert not [u for u in ui_system.get("/api/v1/users")["items"] if u["name"] == "csp-user"]
