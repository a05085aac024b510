"""The admin web UI against a real server, agent and sim engine: login, overview, fragments, logout.

Driven with httpx, the browser's part played by hand: the session cookie is ``Secure``, which a cookie
jar never sends over plain http, so each request carries it in its ``Cookie`` header as a browser on
loopback (a secure context) would.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System, sim_model
from llmgw.testing.uiclient import Browser, Node, page

MODEL = "sim-ui"
def row(doc: Node, attr: str, value: str) -> Node:
    found = doc.find(lambda n: n.tag == "tr" and n.attrs.get(attr) == value)
    assert found is not None, f"no tr[{attr}={value!r}]"
    return found


def cell(tr: Node, cls: str) -> str:
    found = tr.find(lambda n: cls in n.attrs.get("class", "").split())
    assert found is not None, f"no .{cls} cell"
    return found.text


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent and Ready sim model for the module (a server start is seconds; the tests only read)."""
    with system_mod.running(tmp_path_factory.mktemp("ui")) as s:
        s.apply(sim_model(MODEL))
        s.wait_model(MODEL)
        yield s


def test_anonymous_reaches_only_login_and_static(browser: Browser) -> None:
    """Without a session the overview and fragments send to the login; the login page and static files answer."""
    for path in ("/ui/", "/ui", "/ui/fragments/nodes"):
        resp = browser.request("GET", path)
        assert resp.status_code == 303, (path, resp.status_code)
        assert resp.headers["location"] in ("/ui/login", "/ui/"), (path, resp.headers["location"])
    assert browser.request("GET", "/ui/").headers["location"] == "/ui/login"
    login = browser.request("GET", "/ui/login")
    assert login.status_code == 200 and page(login).by_id("login-form") is not None
    assert "llmgw · Log in" in login.text
    js = browser.request("GET", "/ui/static/htmx.min.js")
    assert js.status_code == 200 and "htmx" in js.text[:2000]


def test_root_sends_browsers_to_the_ui_only(browser: Browser) -> None:
    """`/` redirects a browser (Accept: text/html) to /ui/; an API client's `/` is not redirected."""
    resp = browser.request("GET", "/")
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/"
    plain = browser.client.get("/", headers={"accept": "application/json"})
    assert plain.status_code != 303


def test_bad_password_shows_the_apis_message(system: System, browser: Browser) -> None:
    """A refused login re-renders the form with the API's own message in #login-error, and no session."""
    api = httpx.post(f"{system.url}/api/v1/login", json={"username": "admin", "password": "wrong-1"},
                     trust_env=False, timeout=30)
    message = api.json()["error"]["message"]
    resp = browser.login("admin", "wrong-2")
    error = page(resp).by_id("login-error")
    assert resp.status_code == 401 and error is not None and error.text == " ".join(message.split())
    assert "llmgw_session" not in browser.cookies


def test_admin_logs_in_and_sees_the_cluster(system: System, browser: Browser) -> None:
    """After login the overview lists node1 Ready and the model Ready 1/1; the fragments carry the same rows."""
    resp = browser.login("admin", system.admin_password)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/"
    assert "llmgw_session" in browser.cookies
    overview = browser.request("GET", "/ui/")
    assert overview.status_code == 200 and "llmgw · Overview" in overview.text
    doc = page(overview)
    user = doc.by_id("user")
    assert user is not None and user.text == "admin (admin)"
    assert doc.by_id("logout") is not None
    for part in ("nodes", "models", "events"):
        div = doc.by_id(part)
        assert div is not None and div.attrs["hx-get"].startswith(f"/ui/fragments/{part}")
        assert div.attrs["hx-trigger"] == "every 2s"
    assert cell(row(doc, "data-node", "node1"), "state") == "Ready"
    model = row(doc, "data-model", MODEL)
    assert cell(model, "ready") == "1/1" and cell(model, "state") == "Ready"
    nodes = page(browser.request("GET", "/ui/fragments/nodes"))
    assert cell(row(nodes, "data-node", "node1"), "state") == "Ready"
    models = page(browser.request("GET", "/ui/fragments/models"))
    assert cell(row(models, "data-model", MODEL), "ready") == "1/1"
    events = browser.request("GET", "/ui/fragments/events")
    assert events.status_code == 200 and f"model/{MODEL}" in events.text
    assert not doc.find_all(lambda n: "data-mutating" in n.attrs)


def test_viewer_sees_their_role(system: System, browser: Browser) -> None:
    """A viewer created over the REST API logs in and sees their name and role, and the same cluster."""
    made = system.request("POST", "/api/v1/users", json={"name": "vera", "role": "viewer"})
    assert made.status_code == 201, made.text
    assert browser.login("vera", made.json()["password"]).status_code == 303
    doc = page(browser.request("GET", "/ui/"))
    user = doc.by_id("user")
    assert user is not None and user.text == "vera (viewer)"
    assert cell(row(doc, "data-model", MODEL), "ready") == "1/1"
    assert not doc.find_all(lambda n: "data-mutating" in n.attrs)


def test_logout_ends_the_session(system: System, browser: Browser) -> None:
    """Logout clears the cookie and ends the session at the API: the old cookie no longer opens the overview."""
    assert browser.login("admin", system.admin_password).status_code == 303
    old = dict(browser.cookies)
    resp = browser.request("POST", "/ui/logout")
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/login"
    assert "llmgw_session" not in browser.cookies
    browser.cookies = old
    again = browser.request("GET", "/ui/")
    assert again.status_code == 303 and again.headers["location"] == "/ui/login"


def test_the_node_list_pages_in_the_api(system: System) -> None:
    """GET /api/v1/nodes pages by id with offset/limit and always says the total; no limit is every node."""
    every = system.get("/api/v1/nodes")
    assert every["total"] == len(every["items"]) >= 1
    first = system.get("/api/v1/nodes?offset=0&limit=1")
    assert first["total"] == every["total"] and [n["id"] for n in first["items"]] == [every["items"][0]["id"]]
    past = system.get(f"/api/v1/nodes?offset={every['total']}&limit=5")
    assert past == {"items": [], "total": every["total"]}
    refused = system.request("GET", "/api/v1/nodes?limit=-1")
    assert refused.status_code == 422 and "limit" in refused.text  # out-of-range paging: 422 naming the field
