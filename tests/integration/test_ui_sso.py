"""The UI's SSO routes against a real ``llmgw server`` and a real OpenID Connect provider (``oidc-provider``,
``llmgw.testing.oidcprovider``), with httpx as the browser: the authorization request's parameters, the
callback URL's host rule, the state bound to the browser, the session cookie a sign-in sets (the password
login's, attribute for attribute), and a provider's error shown escaped. The browser test of the whole sign-in
is tests/e2e/test_ui_sso_browser.py.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing import procs
from llmgw.testing import system as system_mod
from llmgw.testing.oidcprovider import UI_CALLBACK, OidcProvider
from llmgw.testing.uiclient import Browser, page


class Sso:
    def __init__(self, system: system_mod.System, idp: OidcProvider, url: str) -> None:
        self.system, self.idp, self.url = system, idp, url


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sso]:
    root = tmp_path_factory.mktemp("uissoint")
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
            yield Sso(s, idp, url)
        finally:
            s.close()


@pytest.fixture
def client(sso: Sso) -> Iterator[Browser]:
    b = Browser(sso.url)
    try:
        yield b
    finally:
        b.close()


def _attributes(set_cookie: str) -> dict[str, str]:
    """A Set-Cookie's attributes by lower-case name, its value and its expiry instant left out."""
    _, *attrs = (a.strip() for a in set_cookie.split(";"))
    found = {}
    for a in attrs:
        k, _, v = a.partition("=")
        found[k.lower()] = v.lower()
    found.pop("expires", None)
    return found


def _start(client: Browser) -> dict[str, str]:
    resp = client.request("GET", "/ui/sso/start")
    assert resp.status_code == 303, (resp.status_code, resp.text[:300])
    return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(resp.headers["location"]).query).items()}


def test_start_sends_the_browser_to_the_provider_with_pkce_state_and_nonce(sso: Sso, client: Browser) -> None:
    """/ui/sso/start: 303 to the provider's authorization endpoint with the code flow's parameters and an S256
    challenge; the state is also in a short HttpOnly Lax cookie for /ui/sso only."""
    resp = client.request("GET", "/ui/sso/start")
    assert resp.status_code == 303
    where = urllib.parse.urlsplit(resp.headers["location"])
    meta = httpx.get(f"{sso.idp.issuer}/.well-known/openid-configuration", timeout=10).json()
    assert f"{where.scheme}://{where.netloc}{where.path}" == meta["authorization_endpoint"]
    q = {k: v[0] for k, v in urllib.parse.parse_qs(where.query).items()}
    assert q["response_type"] == "code" and q["client_id"] == sso.idp.client_id
    assert q["redirect_uri"] == f"{sso.url}/ui/sso/callback"
    assert "openid" in q["scope"].split()
    assert q["code_challenge_method"] == "S256" and len(q["code_challenge"]) == 43
    assert len(q["state"]) >= 16 and len(q["nonce"]) >= 16 and q["state"] != q["nonce"]
    [cookie] = [c for c in resp.headers.get_list("set-cookie") if c.startswith("llmgw_sso_state=")]
    assert cookie.split(";")[0] == f"llmgw_sso_state={q['state']}"
    attrs = _attributes(cookie)
    assert "httponly" in attrs and attrs["samesite"] == "lax" and attrs["path"] == "/ui/sso", attrs
    assert int(attrs["max-age"]) <= 600
    assert _start(client)["state"] != q["state"], "two sign-ins got the same state"


def test_a_forged_host_gets_no_authorization_request(sso: Sso, client: Browser) -> None:
    """A Host that is none of the server's names (or another port of it) is refused with a sentence naming it
    and the setting: no redirect to the provider, no state made."""
    for host in ("evil.example", f"evil.example:{sso.system.http_port}", "localhost:1"):
        resp = client.request("GET", "/ui/sso/start", headers={"host": host})
        assert resp.status_code == 400 and "location" not in resp.headers, (host, resp.status_code)
        error = page(resp).get("login-error").text
        assert host in error and "--sso-redirect-url" in error, error
        assert "llmgw_sso_state" not in client.cookies


def test_a_sign_in_sets_the_session_cookie_as_a_password_login_does(sso: Sso, client: Browser) -> None:
    """alice through the provider's real pages: the callback sets ``llmgw_session`` with exactly the attributes
    the password login's ``/api/v1/login`` sets, lands on the overview by a same-site navigation, and the session
    is alice's (admin) in the REST API."""
    params = _start(client)
    authorize = f"{sso.idp.issuer}/auth?{urllib.parse.urlencode(params)}"
    back = sso.idp.approve(authorize, "alice")
    assert back.startswith(f"{sso.url}/ui/sso/callback?"), back
    resp = client.request("GET", back.removeprefix(sso.url))
    assert resp.status_code == 200, (resp.status_code, resp.text[:400])
    landing = page(resp)
    refresh = landing.find(lambda n: n.tag == "meta" and n.attrs.get("http-equiv") == "refresh")
    assert refresh is not None and refresh.attrs["content"].endswith("url=/ui/")
    assert landing.get("continue").attrs["href"] == "/ui/"
    [sso_cookie] = [c for c in resp.headers.get_list("set-cookie") if c.startswith("llmgw_session=")]

    password = httpx.post(f"{sso.url}/api/v1/login", timeout=30, json={
        "username": "admin", "password": sso.system.admin_password, "session": True})
    assert password.status_code == 200, password.text
    [password_cookie] = [c for c in password.headers.get_list("set-cookie") if c.startswith("llmgw_session=")]
    assert _attributes(sso_cookie) == _attributes(password_cookie)

    who = httpx.get(f"{sso.url}/api/v1/whoami", timeout=10, headers={"cookie": f"llmgw_session="
                                                                              f"{client.cookies['llmgw_session']}"})
    assert (who.json()["name"], who.json()["role"]) == ("alice", "admin"), who.text
    overview = client.request("GET", "/ui/")
    assert overview.status_code == 200 and "alice" in page(overview).get("user").text


def test_a_callback_from_another_browser_is_refused_before_the_code_is_used(sso: Sso, client: Browser) -> None:
    """A callback whose state is not the one this browser started (no cookie, or another sign-in's) is refused
    with a sentence; the code is not spent, so the browser that started it still signs in with it."""
    params = _start(client)
    back = sso.idp.approve(f"{sso.idp.issuer}/auth?{urllib.parse.urlencode(params)}", "bob").removeprefix(sso.url)
    stranger = Browser(sso.url)
    try:
        resp = stranger.request("GET", back)
        assert resp.status_code == 400 and "llmgw_session" not in stranger.cookies
        assert "not started in this browser" in page(resp).get("login-error").text
        stranger.cookies["llmgw_sso_state"] = "another-sign-ins-state"
        assert stranger.request("GET", back).status_code == 400 and "llmgw_session" not in stranger.cookies
    finally:
        stranger.close()
    resp = client.request("GET", back)
    assert resp.status_code == 200 and client.cookies.get("llmgw_session"), resp.text[:400]


def test_a_providers_error_is_shown_escaped_with_no_session(sso: Sso, client: Browser) -> None:
    """``?error=…&error_description=…`` from the provider: the login page says it in a sentence; HTML in it is
    text, never markup; no session cookie."""
    _start(client)
    q = urllib.parse.urlencode({"error": "access_denied", "error_description": "<img src=x onerror=alert(1)>",
                                "state": client.cookies["llmgw_sso_state"]})
    resp = client.request("GET", f"/ui/sso/callback?{q}")
    assert resp.status_code == 400 and "llmgw_session" not in client.cookies
    assert "<img src=x" not in resp.text and "&lt;img src=x onerror=alert(1)&gt;" in resp.text
    error = page(resp).get("login-error").text
    assert "access_denied" in error and "<img src=x onerror=alert(1)>" in error
    assert page(resp).by_id("sso-login") is not None, "the page should offer to sign in again"


def test_without_sso_the_login_page_has_no_sso_button_and_the_routes_go_to_the_login(tmp_path: Path) -> None:
    """A server without ``--sso-issuer``: no "Sign in with SSO", and /ui/sso/* answer 303 to the login."""
    s = system_mod.System(tmp_path)
    b = None
    try:
        s.start_server()
        b = Browser(s.url)
        login = page(b.request("GET", "/ui/login"))
        assert login.by_id("sso-login") is None and login.by_id("login-form") is not None
        for path in ("/ui/sso/start", "/ui/sso/callback?code=x&state=y"):
            resp = b.request("GET", path)
            assert resp.status_code == 303 and resp.headers["location"] == "/ui/login", (path, resp.status_code)
    finally:
        if b is not None:
            b.close()
        s.close()


def test_when_sso_is_required_the_password_form_is_behind_the_break_glass_link(sso: Sso, client: Browser) -> None:
    """``sso_required`` on (an admin's cluster setting): the login page offers SSO and a "local administrator"
    link instead of the password form; that link's page has the form, and the break-glass admin logs in with it,
    while another local user's password login is refused in the API's words. Off again: the form is back."""
    made = sso.system.request("POST", "/api/v1/users", json={"name": "dave", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    dave_password = made.json()["password"]
    assert sso.system.request("PUT", "/api/v1/settings", json={"sso_required": True}).status_code == 200
    try:
        login = page(client.request("GET", "/ui/login"))
        assert login.by_id("sso-login") is not None and login.by_id("login-form") is None
        assert login.get("local-login").attrs["href"] == "/ui/login?local=1"

        local = page(client.request("GET", "/ui/login?local=1"))
        assert local.get("login-form").attrs["action"] == "/ui/login?local=1"
        refused = client.request("POST", "/ui/login?local=1", data={"username": "dave", "password": dave_password})
        assert refused.status_code == 401 and "llmgw_session" not in client.cookies
        again = page(refused)
        assert "requires single sign-on" in again.get("login-error").text
        assert again.by_id("login-form") is not None, "a refused break-glass login should keep its form"
        done = client.login("admin", sso.system.admin_password)
        assert done.status_code == 303 and client.cookies.get("llmgw_session"), done.text[:300]
    finally:
        assert sso.system.request("PUT", "/api/v1/settings", json={"sso_required": False}).status_code == 200
    client.cookies.clear()
    assert page(client.request("GET", "/ui/login")).by_id("login-form") is not None


def test_payloads_in_the_sso_routes_come_back_escaped_with_the_security_headers(sso: Sso, client: Browser) -> None:
    """Markup in every query parameter of both SSO routes, with and without this browser's state: never sent
    back unescaped, always under the UI's Content-Security-Policy, never a session."""
    payload = '"><script>alert(1)</script>'
    _start(client)
    mine = client.cookies["llmgw_sso_state"]
    for path in ("/ui/sso/start", "/ui/sso/callback"):
        for state in (payload, mine):
            for params in ({"code": payload, "state": state}, {"error": payload, "error_description": payload,
                                                               "state": state}, {"state": state}):
                resp = client.request("GET", path, params=params)
                assert resp.status_code < 500 and payload not in resp.text, (path, params, resp.status_code)
                assert "script-src 'self'" in resp.headers["content-security-policy"], (path, params)
                assert "llmgw_session" not in client.cookies, (path, params)


def test_a_replayed_callback_is_refused_by_the_server_and_audited_with_the_browsers_address(sso: Sso) -> None:
    """The callback URL used again in the browser that signed in with it (its state cookie still there): the
    server refuses the spent state in a sentence, sets no session, and audits the refusal with the browser's
    own address (127.0.0.7 here), not the UI's in-process one."""
    b = Browser(sso.url, source="127.0.0.7")
    try:
        params = _start(b)
        back = sso.idp.approve(f"{sso.idp.issuer}/auth?{urllib.parse.urlencode(params)}", "bob")
        assert b.request("GET", back.removeprefix(sso.url)).status_code == 200
        b.cookies.pop("llmgw_session")
        again = b.request("GET", back.removeprefix(sso.url))
        assert again.status_code in (401, 403) and "llmgw_session" not in b.cookies, again.status_code
        assert "used already" in page(again).get("login-error").text
    finally:
        b.close()
    lines = [e for e in sso.system.get("/api/v1/audit?limit=500")["items"]
             if e["action"] == "sso login" and e["outcome"] == "refused" and "sso_unknown_state" in e["detail"]]
    assert [e for e in lines if e["actor"] == "sso@127.0.0.7"], lines[:3]
