"""The admin UI against a browser's attacker, on a real server: script injection, sessions, logins and logouts.

- HTML and script fed into every UI route's path parameters, query parameters and form fields never comes
  back unescaped, and every answer (page, fragment, redirect, static file, 404) carries the
  Content-Security-Policy, nosniff and no-framing headers. ``GET /ui/fragments/<img src=x onerror=...>``
  sent the tag back as HTML, to any cookie value at all.
- A cookie that is no live session goes to the login from every route, as an ended one does.
- Failures from one address never lock a correct password out from another: the UI passes the browser's
  address to the API (every UI login reached the limiter, and the audit log, as 127.0.0.1).
- A logout ends the session on the server whatever its Origin; a login posted from another site is refused.

The routes, query parameters and form fields are read from the UI's own code, so a page added later is
covered without editing this test. Logins come from loopback addresses of their own (127.0.0.2...).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from llmgw.control.ui import app as ui_app
from llmgw.control.ui import guard
from llmgw.testing.system import System
from llmgw.testing.uiclient import Browser, logged_in

UI_SOURCE = Path(ui_app.__file__).parent
#: What an attacker puts in a URL a victim is sent to (no '/', '?' or '#': each stays one path segment).
PATH_PAYLOADS = ("<img src=x onerror=alert(1)>", '"><svg onload=alert(1)>', "'><iframe srcdoc=x>")
#: And in a query string or a form field, where anything goes.
FIELD_PAYLOADS = (*PATH_PAYLOADS, "</textarea><script>alert(1)</script>", "</pre><script src=//evil.example/x.js>")
HEADERS = {"content-security-policy": "frame-ancestors 'none'", "x-content-type-options": "nosniff",
           "x-frame-options": "DENY"}


def routes() -> list[tuple[str, str]]:
    """(method, path template below /ui) of every route the UI app serves, read from the app."""
    app: Any = ui_app.create_ui(lambda scope, receive, send: None)  # type: ignore[arg-type,return-value]
    while not hasattr(app, "routes"):
        app = app.app
    found = [(m, r.path) for r in app.routes if isinstance(r, Route) for m in sorted(r.methods or ()) if m != "HEAD"]
    assert ("GET", "/fragments/{which}") in found and ("POST", "/apply") in found, found
    return found


def names_read(pattern: str) -> list[str]:
    """Every name the UI's code reads with ``pattern`` (its query parameters, its form fields)."""
    return sorted({m for f in UI_SOURCE.glob("*.py") for m in re.findall(pattern, f.read_text())})


QUERY = [*names_read(r'query_params\.get\("(\w+)"'), "q"]
FORM = names_read(r'form\.get\("(\w+)"')


def fill(path: str, payload: str) -> str:
    return re.sub(r"{\w+[^}]*}", lambda _: payload, path)


def check_headers(resp: httpx.Response, what: object) -> None:
    for name, part in HEADERS.items():
        assert part in resp.headers.get(name, ""), (what, resp.status_code, name, dict(resp.headers))
    assert "script-src 'self'" in resp.headers["content-security-policy"] and "unsafe-inline" not in \
        resp.headers["content-security-policy"]


def check_escaped(resp: httpx.Response, payloads: tuple[str, ...], what: object) -> None:
    for p in payloads:
        assert p not in resp.text, (what, resp.status_code, p, resp.text[:500])


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A server alone (no agent: the pages read the API, and a refusal is what they show)."""
    s = System(tmp_path_factory.mktemp("uisecurity"))
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def test_payloads_in_every_route_come_back_escaped_with_the_security_headers(system: System) -> None:
    """As the admin: each payload in every path parameter, query parameter and form field of every UI route; the
    answer never holds it unescaped and always carries the CSP, nosniff and no-framing headers."""
    admin = logged_in(system.url, "admin", system.admin_password)
    try:
        ended = 0
        for method, path in routes():
            # The session's own end, the login form (below) and the SSO sign-in (test_ui_sso.py): open routes.
            if path in guard.SessionGuard.OPEN:
                continue
            for payload in PATH_PAYLOADS:
                params = {q: FIELD_PAYLOADS[i % len(FIELD_PAYLOADS)] for i, q in enumerate(QUERY)}
                form = {f: FIELD_PAYLOADS[i % len(FIELD_PAYLOADS)] for i, f in enumerate(FORM)}
                for hx in ({}, {"hx-request": "true"}):
                    resp = admin.request(method, f"/ui{fill(path, payload)}", params=params, headers=hx,
                                         data=form if method == "POST" else None)
                    what = (method, path, payload, hx)
                    assert resp.status_code < 500, (what, resp.status_code, resp.text[:500])
                    ended += resp.headers.get("location") == "/ui/login"
                    check_escaped(resp, FIELD_PAYLOADS, what)
                    check_headers(resp, what)
        assert ended == 0, "a route ended the admin's session"
        for payload in FIELD_PAYLOADS:
            resp = Browser(system.url, source="127.0.0.9").login(payload, payload)  # the form shows the name back
            check_escaped(resp, FIELD_PAYLOADS, ("login", payload))
            check_headers(resp, ("login", payload))
        for path in ("/ui/login", "/ui/static/ui.css", "/ui/static/htmx.min.js", "/ui/static/ui.js", "/ui",
                     f"/ui/no-such-page{PATH_PAYLOADS[0]}", "/ui/static/no-such-file"):
            resp = admin.request("GET", path)
            check_headers(resp, path)
            check_escaped(resp, PATH_PAYLOADS, path)
    finally:
        admin.close()


def test_a_cookie_that_is_no_session_goes_to_the_login_from_every_route(system: System) -> None:
    """Any made-up cookie value (the guard checked only that one was there): every route but the open ones (the
    login's, logout's, SSO sign-in's) answers a 303 to the login, or HX-Redirect for htmx; the fragment's name never
    comes back."""
    for cookie in ("x", PATH_PAYLOADS[0].replace(" ", "")):
        for method, path in routes():
            if path in guard.SessionGuard.OPEN:
                continue
            for hx in (False, True):
                b = Browser(system.url)
                b.cookies = {"llmgw_session": cookie}
                resp = b.request(method, f"/ui{fill(path, PATH_PAYLOADS[0])}", headers={"hx-request": "true"} if hx
                                 else {})
                b.close()
                want = (204, "hx-redirect") if hx else (303, "location")
                assert resp.status_code == want[0] and resp.headers[want[1]] == "/ui/login", (
                    method, path, cookie, resp.status_code, resp.text[:300])
                check_headers(resp, (method, path))
                check_escaped(resp, PATH_PAYLOADS, (method, path))


def test_a_logout_ends_the_session_on_the_server_whatever_its_origin(system: System) -> None:
    """POST /ui/logout with no Origin (not a browser's form) and with another site's: the session is ended on the
    server (it was left valid for 12 h while the cookie was cleared); the REST logout with the cookie alone too."""
    for origin in (None, "https://evil.example"):
        b = logged_in(system.url, "admin", system.admin_password)
        jar = {"cookie": f"llmgw_session={b.cookies['llmgw_session']}"}
        assert system.request("GET", "/api/v1/whoami", headers=jar | {"Authorization": ""}).status_code == 200
        resp = b.request("POST", "/ui/logout", headers={"origin": origin})
        b.close()
        assert resp.status_code == 303 and resp.headers["location"] == "/ui/login", resp.text[:300]
        assert system.request("GET", "/api/v1/whoami", headers=jar | {"Authorization": ""}).status_code == 401, origin
    b = logged_in(system.url, "admin", system.admin_password)
    jar = {"cookie": f"llmgw_session={b.cookies['llmgw_session']}", "Authorization": ""}
    b.close()
    out = system.request("POST", "/api/v1/logout", headers=jar)
    assert out.status_code == 200 and out.json() == {"logged_out": True}, out.text
    assert system.request("GET", "/api/v1/whoami", headers=jar).status_code == 401


def test_a_login_posted_from_another_site_is_refused(system: System) -> None:
    """The login form posted with another site's Origin, a 'null' one, or (no Origin) another site's Referer: 403
    saying why, no cookie; with neither (a script, not a browser's page) or this server's own: logged in."""
    for headers in ({"origin": "https://evil.example"}, {"origin": "null"},
                    {"origin": None, "referer": "https://evil.example/login.html"}):
        b = Browser(system.url, source="127.0.0.8")
        resp = b.request("POST", "/ui/login", headers=headers,
                         data={"username": "admin", "password": system.admin_password})
        b.close()
        assert resp.status_code == 403 and "cross-site login" in resp.text and not b.cookies, (headers, resp.text)
        check_headers(resp, headers)
    rest = httpx.post(f"{system.url}/api/v1/login", headers={"origin": "https://evil.example"}, timeout=30,
                      json={"username": "admin", "password": system.admin_password})
    assert rest.status_code == 403 and rest.json()["error"]["code"] == "cross_site_login", rest.text
    for headers in ({"origin": None}, {"origin": system.url}, {"origin": None, "referer": f"{system.url}/ui/login"}):
        b = Browser(system.url, source="127.0.0.8")
        resp = b.request("POST", "/ui/login", headers=headers,
                         data={"username": "admin", "password": system.admin_password})
        b.close()
        assert resp.status_code == 303 and "llmgw_session" in b.cookies, (headers, resp.status_code, resp.text[:300])


def audit_logins(system: System, name: str) -> list[dict[str, Any]]:
    return [e for e in system.get("/api/v1/audit?limit=10000")["items"]
            if e["action"] == "login" and e["object"] == f"user/{name}"]


def test_failed_ui_logins_from_one_address_never_lock_out_another(system: System) -> None:
    """Twenty wrong UI logins with made-up names from 127.0.0.2 refuse that address, itself; the admin's UI
    login from 127.0.0.3 and REST login from 127.0.0.1 still work, and the audit log names the browser's address
    (every UI login reached the API as 127.0.0.1, so the whole UI was locked out and the log said 127.0.0.1)."""
    attacker = Browser(system.url, source="127.0.0.2")
    try:
        for i in range(20):
            resp = attacker.login(f"made-up-{i}", "wrong")
            assert resp.status_code == 401, (i, resp.status_code, resp.text[:300])
        resp = attacker.login("admin", system.admin_password)
        assert resp.status_code == 429 and "too many failed logins from 127.0.0.2" in resp.text, resp.text[:500]
    finally:
        attacker.close()
    admin = Browser(system.url, source="127.0.0.3")
    try:
        admin.log_in("admin", system.admin_password)
    finally:
        admin.close()
    rest = httpx.post(f"{system.url}/api/v1/login", json={"username": "admin", "password": system.admin_password},
                      timeout=30)
    assert rest.status_code == 200, rest.text
    actors = [e["actor"] for e in audit_logins(system, "made-up-0")]
    assert actors and all("127.0.0.2" in a for a in actors), actors
    assert "user:admin (127.0.0.3)" in [e["actor"] for e in audit_logins(system, "admin")]


def test_wrong_passwords_for_the_admin_from_one_address_only_slow_another(system: System) -> None:
    """Six wrong passwords for admin from 127.0.0.4 (UI) refuse that address even with the right one; the admin's
    right password from 127.0.0.5, over the UI and over REST, logs in (slowed, never refused)."""
    attacker = Browser(system.url, source="127.0.0.4")
    try:
        codes = [attacker.login("admin", f"guess-{i}").status_code for i in range(6)]
        assert codes == [401] * 5 + [429], codes
        assert attacker.login("admin", system.admin_password).status_code == 429
    finally:
        attacker.close()
    owner = Browser(system.url, source="127.0.0.5")
    try:
        owner.log_in("admin", system.admin_password)
    finally:
        owner.close()
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.6"), timeout=30) as c:
        r = c.post(f"{system.url}/api/v1/login", json={"username": "admin", "password": system.admin_password})
    assert r.status_code == 200, r.text
    assert guard.PEER_HEADER  # the UI's header: sent from outside it changes nothing (below)
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4"), timeout=30) as c:
        r = c.post(f"{system.url}/api/v1/login", headers={guard.PEER_HEADER: "127.0.0.7"},
                   json={"username": "admin", "password": system.admin_password})
    assert r.status_code == 429, r.text
