"""The UI's one session guard against a real server: every page, fragment and form of the UI sends a
browser whose session ended to the login (a 303, or ``HX-Redirect`` for an htmx fragment request); on an
``--insecure`` server, where the API lets anyone in and refuses every login, the pages open without one.

The routes are read from the UI app itself, so a page added later is covered without editing this test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from starlette.routing import Route

from llmgw.control.ui import app as ui_app
from llmgw.control.ui import guard
from llmgw.testing import system as system_mod
from llmgw.testing.system import System, sim_model
from llmgw.testing.uiclient import Browser, page

#: A path parameter's stand-in; ``which`` must name a real fragment or the route answers 404 before any API call.
PARAMS = {"which": "nodes"}


def ui_routes() -> list[tuple[str, str]]:
    """(method, path below /ui) of every route the UI serves but those open without a session (the login's, the
    SSO sign-in's)."""
    app: Any = ui_app.create_ui(lambda scope, receive, send: None)  # type: ignore[arg-type,return-value]
    while not hasattr(app, "routes"):
        app = app.app
    found = []
    for r in app.routes:
        if not isinstance(r, Route) or r.path in guard.SessionGuard.OPEN:
            continue
        path = re.sub(r"{(\w+)[^}]*}", lambda m: PARAMS.get(m.group(1), "x"), r.path)
        found += [(m, path) for m in sorted(r.methods or ()) if m != "HEAD"]
    return found


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with system_mod.running(tmp_path_factory.mktemp("uisession")) as s:
        yield s


def test_every_route_sends_an_ended_session_to_the_login(system: System, browser: Browser) -> None:
    """A cookie the API no longer takes (logged out) gets a 303 to /ui/login from every UI route, GET or POST."""
    browser.log_in("admin", system.admin_password)
    ended = dict(browser.cookies)
    assert browser.request("POST", "/ui/logout").status_code == 303
    routes = ui_routes()
    assert ("GET", "/models/x") in routes and ("POST", "/apply") in routes and ("GET", "/audit") in routes
    for method, path in routes:
        browser.cookies = dict(ended)
        resp = browser.request(method, f"/ui{path}", data={"delta": "1", "spec": "a: 1"} if method == "POST" else None)
        assert resp.status_code == 303 and resp.headers["location"] == "/ui/login", (method, path, resp.status_code,
                                                                                     resp.text[:300])


def test_every_route_without_a_cookie_goes_to_the_login(browser: Browser) -> None:
    """No session cookie at all: every UI route but the login and static files answers a 303 to the login."""
    for method, path in ui_routes():
        resp = browser.request(method, f"/ui{path}")
        assert resp.status_code == 303 and resp.headers["location"] == "/ui/login", (method, path, resp.status_code)


def test_htmx_fragment_of_an_ended_session_redirects_the_whole_page(system: System, browser: Browser) -> None:
    """An htmx request whose session ended gets HX-Redirect to the login (a 303 would swap the login into the part)."""
    for path in ("/ui/fragments/nodes", "/ui/nodes/node1/live", "/ui/nodes/node1/log", "/ui/models/x/live"):
        browser.cookies = {"llmgw_session": "no-such-session"}
        resp = browser.request("GET", path, headers={"hx-request": "true"})
        assert resp.status_code == 204 and resp.headers["hx-redirect"] == "/ui/login", (path, resp.status_code)


@pytest.fixture(scope="module")
def insecure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A loopback development server (``--insecure``): the API answers anyone as an administrator."""
    with system_mod.running(tmp_path_factory.mktemp("uiinsecure"), secure=False) as s:
        yield s


def test_insecure_server_opens_every_page_without_a_login(insecure: System) -> None:
    """On an --insecure server a browser with no session sees each page (no redirect to a login the API would
    refuse), the nav names the caller as /api/v1/whoami does, and there is no log-out button to loop on."""
    b = Browser(insecure.url)
    try:
        who = insecure.get("/api/v1/whoami")
        for path in ("/ui/", "/ui/models", "/ui/nodes", "/ui/nodes/node1", "/ui/keys", "/ui/playground", "/ui/apply",
                     "/ui/deploy", "/ui/audit", "/ui/fragments/nodes"):
            resp = b.request("GET", path)
            assert resp.status_code == 200, (path, resp.status_code, resp.headers.get("location"), resp.text[:300])
        doc = page(b.request("GET", "/ui/"))
        assert doc.get("user").text == f"{who['name']} ({who['role']})" == "insecure (admin)"
        assert doc.by_id("logout") is None and doc.by_id("insecure") is not None
        row = doc.find(lambda n: n.tag == "tr" and n.attrs.get("data-node") == "node1")
        assert row is not None, "node1 not on the overview"
        for resp in (b.request("GET", "/ui/login"), b.login("admin", "anything")):
            assert resp.status_code == 303 and resp.headers["location"] == "/ui/", resp.text[:300]
        made = b.request("POST", "/ui/apply", data={"op": "apply", "spec": yaml.safe_dump(sim_model("dev-ui"))})
        assert made.status_code == 303 and made.headers["location"] == "/ui/models/dev-ui", made.text[:300]
        assert insecure.get("/api/v1/models/dev-ui")["spec"]["replicas"] == 1
    finally:
        b.close()


def test_a_login_is_the_browsers_alone(system: System, browser: Browser) -> None:
    """After one browser logs in through the UI, a caller with no cookie (another browser) is still sent to the
    login from every page: the UI's in-process client to the API shares no cookie between callers."""
    browser.log_in("admin", system.admin_password)
    assert browser.request("GET", "/ui/").status_code == 200
    other = Browser(system.url)
    try:
        for path in ("/ui/", "/ui/nodes", "/ui/models", "/ui/keys", "/ui/usage"):
            got = other.request("GET", path)
            assert got.status_code == 303 and got.headers["location"] == "/ui/login", (path, got.status_code)
    finally:
        other.close()
