"""Sign in with SSO in a real browser: Debian's Chromium, a real ``llmgw server`` configured for single sign-on,
and a real OpenID Connect provider (the certified ``oidc-provider`` from npm, ``llmgw.testing.oidcprovider``),
through the provider's own login and consent pages.

The browser opens the UI at ``http://localhost:PORT`` while the provider is ``http://127.0.0.1:PORT2``: two
sites, as a real provider is to a real cluster, so the provider's redirect back is a cross-site navigation
and the ``SameSite=Strict`` session cookie must still be there on the overview (the landing page's own
navigation carries it, a 303 would not).

alice is in ``llmgw-admins`` (admin), bob in ``llmgw-viewers`` (viewer), carol in no mapped group.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, procs
from llmgw.testing import system as system_mod
from llmgw.testing.oidcprovider import UI_CALLBACK, OidcProvider

pytestmark = pytest.mark.slow

WAIT_MS = 30_000


class SsoSystem:
    """The server (``system``), the provider (``idp``) and the UI's address as the browser opens it (``url``)."""

    def __init__(self, system: system_mod.System, idp: OidcProvider, url: str) -> None:
        self.system, self.idp, self.url = system, idp, url


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SsoSystem]:
    root = tmp_path_factory.mktemp("uisso")
    port = procs.free_port()
    url = f"http://localhost:{port}"
    with OidcProvider(root / "idp", redirect_uris=[f"{url}{UI_CALLBACK}"]) as idp:
        s = system_mod.System(root / "llmgw", server_args=[
            "--sso-issuer", idp.issuer, "--sso-client-id", idp.client_id,
            "--sso-client-secret-file", str(idp.secret_file),
            "--sso-role-map", "llmgw-admins=admin", "--sso-role-map", "llmgw-viewers=viewer"])
        s.http_port = port
        try:
            s.start_server()
            yield SsoSystem(s, idp, url)
        finally:
            s.close()


def _through_the_provider(page: sync_api.Page, sso: SsoSystem, account: str) -> None:
    """From the login page: the SSO button, the provider's real sign-in form, its consent page."""
    page.goto("/ui/")
    assert page.url.endswith("/ui/login"), page.url
    page.locator("#sso-login").click()
    page.wait_for_url(f"{sso.idp.issuer}/**")
    page.locator("input[name=login]").fill(account)
    page.locator("input[name=password]").fill("pw")
    page.locator("button[type=submit]").click()
    # The consent page (a first sign-in of this account to this client).
    expect(page.locator("button[type=submit]")).to_have_text("Continue", timeout=WAIT_MS)
    page.locator("button[type=submit]").click()


def _session_cookie(page: sync_api.Page) -> list[dict[str, object]]:
    return [dict(c) for c in page.context.cookies() if c["name"] == "llmgw_session"]


def test_an_admin_signs_in_through_the_providers_pages_and_lands_on_the_overview_as_admin(
        sso: SsoSystem, chrome: browser.Browser) -> None:
    """alice: /ui/ → the login page → "Sign in with SSO" → the provider's login and consent → the overview, signed
    in as alice (admin): the admin-only Users link is there, and the session cookie is HttpOnly and Strict (on
    this plain loopback server not Secure, exactly as a password login's, which is Secure on HTTPS)."""
    page = chrome.page(base_url=sso.url)
    page.goto("/ui/login")
    button = page.locator("#sso-login")
    expect(button).to_have_text(re.compile(r"^Sign in with "))
    expect(page.locator("#login-form")).to_be_visible()   # SSO not required: the password form stays
    chrome.screenshot(page, "login with sso")
    with page.expect_request(re.compile(r".*/ui/sso/start$")):
        _through_the_provider(page, sso, "alice")
    page.wait_for_url(f"{sso.url}/ui/", timeout=WAIT_MS)
    expect(page).to_have_title("llmgw · Overview")
    expect(page.locator("#user")).to_have_text(re.compile(r"alice\s*\(admin\)"))
    expect(page.locator('nav a[href="/ui/users"]')).to_be_visible()
    chrome.screenshot(page, "overview as alice")
    [cookie] = _session_cookie(page)
    assert cookie["httpOnly"] and not cookie["secure"] and cookie["sameSite"] == "Strict", cookie
    # The session is the API's own: the REST API answers it as alice.
    who = page.request.get(f"{sso.url}/api/v1/whoami").json()
    assert (who["name"], who["role"]) == ("alice", "admin"), who


def test_a_viewer_lands_without_admin_controls_and_a_replayed_callback_is_refused(
        sso: SsoSystem, chrome: browser.Browser) -> None:
    """bob (viewer) lands on the overview without the Users or Audit links, and the models page offers him no
    control; the callback URL he came back by, opened again after logging out, is refused by the server (the
    state was spent) with a sentence and no session; in another browser it is refused before any exchange."""
    page = chrome.page(base_url=sso.url)
    callbacks: list[str] = []
    page.on("request", lambda r: callbacks.append(r.url) if "/ui/sso/callback" in r.url else None)
    _through_the_provider(page, sso, "bob")
    page.wait_for_url(f"{sso.url}/ui/", timeout=WAIT_MS)
    expect(page.locator("#user")).to_have_text(re.compile(r"bob\s*\(viewer\)"))
    expect(page.locator("nav")).to_contain_text("Models")
    assert page.locator('nav a[href="/ui/users"]').count() == 0
    assert page.locator('nav a[href="/ui/audit"]').count() == 0
    page.goto("/ui/models")
    assert page.locator("[data-mutating]").count() == 0, "a viewer was offered a control that changes something"
    chrome.screenshot(page, "overview as bob")

    [callback] = callbacks
    assert "code=" in callback and "state=" in callback, callback
    page.locator("#logout").click()
    page.wait_for_url("**/ui/login")
    assert not _session_cookie(page)
    page.goto(callback)
    error = page.locator("#login-error")
    expect(error).to_be_visible()
    words = error.inner_text()
    assert len(words.split()) >= 5 and "state" in words.lower(), words
    chrome.screenshot(page, "replayed callback")
    assert not _session_cookie(page)
    page.goto("/ui/")
    assert page.url.endswith("/ui/login"), page.url

    other = chrome.page(base_url=sso.url)
    other.goto(callback)
    expect(other.locator("#login-error")).to_contain_text("not started in this browser")
    assert not _session_cookie(other)


def test_the_user_cancelling_at_the_provider_is_shown_access_denied_and_gets_no_session(
        sso: SsoSystem, chrome: browser.Browser) -> None:
    """The provider's own "[ Cancel ]" link on its sign-in page sends ``error=access_denied`` back: the login
    page says so in a sentence, and no session is set."""
    page = chrome.page(base_url=sso.url)
    page.goto("/ui/login")
    page.locator("#sso-login").click()
    page.wait_for_url(f"{sso.idp.issuer}/**")
    page.get_by_text("[ Cancel ]").click()
    page.wait_for_url(re.compile(r".*/ui/sso/callback\?.*error=access_denied.*"), timeout=WAIT_MS)
    error = page.locator("#login-error")
    expect(error).to_contain_text("access_denied")
    assert len(error.inner_text().split()) >= 8
    chrome.screenshot(page, "access denied")
    assert not _session_cookie(page)


def test_a_user_whose_groups_map_to_no_role_is_refused_in_words(sso: SsoSystem, chrome: browser.Browser) -> None:
    """carol signs in at the provider, but none of her groups maps to a role: the login page gives the server's
    sentence and no session."""
    page = chrome.page(base_url=sso.url)
    _through_the_provider(page, sso, "carol")
    page.wait_for_url(re.compile(r".*/ui/sso/callback\?.*"), timeout=WAIT_MS)
    error = page.locator("#login-error")
    expect(error).to_be_visible()
    assert len(error.inner_text().split()) >= 5, error.inner_text()
    chrome.screenshot(page, "unmapped user")
    assert not _session_cookie(page)


def test_sso_required_hides_the_password_form_behind_the_break_glass_link(sso: SsoSystem,
                                                                           chrome: browser.Browser) -> None:
    """With ``sso_required`` on, a phone-width login page shows "Sign in with SSO" and the "local administrator"
    link, no password form; the link opens the form, and the break-glass admin logs in with it."""
    assert sso.system.request("PUT", "/api/v1/settings", json={"sso_required": True}).status_code == 200
    try:
        page = chrome.page(base_url=sso.url, viewport=browser.PHONE)
        page.goto("/ui/login")
        expect(page.locator("#sso-login")).to_be_visible()
        assert page.locator("#login-form").count() == 0
        assert page.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width
        chrome.screenshot(page, "sso required")
        page.locator("#local-login").click()
        form = page.locator("#login-form")
        expect(form).to_be_visible()
        form.locator("[name=username]").fill("admin")
        form.locator("[name=password]").fill(sso.system.admin_password)
        form.get_by_role("button").first.click()
        page.wait_for_url(f"{sso.url}/ui/")
        expect(page.locator("#user")).to_have_text(re.compile(r"admin\s*\(admin\)"))
        chrome.screenshot(page, "break-glass admin")
    finally:
        assert sso.system.request("PUT", "/api/v1/settings", json={"sso_required": False}).status_code == 200
