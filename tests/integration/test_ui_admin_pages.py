"""The Audit and Users pages against a real server and agent: the audit log newest first and paged,
users created (password shown once), re-roled and deleted, and a viewer refused in the API's words.

Driven with httpx as in test_ui_pages.py: the session cookie is ``Secure``, which a cookie jar never
sends over plain http, so each request carries it in its ``Cookie`` header as a browser on loopback would.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llmgw.control.ui import audit_page
from llmgw.testing import system as system_mod
from llmgw.testing.system import System
from llmgw.testing.uiclient import Browser, Node, page


def rows(doc: Node, attr: str) -> list[Node]:
    return doc.find_all(lambda n: n.tag == "tr" and attr in n.attrs)


def cell(tr: Node, cls: str) -> str:
    found = tr.find_all(lambda n: cls in n.attrs.get("class", "").split())
    assert found, f"no .{cls} cell"
    return found[0].text


def mutating(doc: Node) -> list[Node]:
    return doc.find_all(lambda n: "data-mutating" in n.attrs)


def nav_links(doc: Node) -> list[str]:
    return [a.text for a in doc.find_all(lambda n: n.tag == "a" and n.attrs.get("href", "").startswith("/ui"))]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server and agent for the module (a server start is seconds)."""
    with system_mod.running(tmp_path_factory.mktemp("ui-admin")) as s:
        yield s


def test_audit_page_lists_the_admins_login_newest_first(system: System, browser: Browser) -> None:
    """The audit page shows the admin's UI login as the API's log has it, rows in descending id order."""
    browser.log_in("admin", system.admin_password)
    resp = browser.request("GET", "/ui/audit")
    assert resp.status_code == 200 and "llmgw · Audit" in resp.text
    doc = page(resp)
    logins = [e for e in system.get("/api/v1/audit?limit=10000")["items"]
              if e["action"] == "login" and e["actor"].startswith("user:admin ") and e["outcome"] == "ok"]
    assert logins, "the API logged no admin login"
    shown = {r.attrs["data-audit"]: r for r in rows(doc, "data-audit")}
    newest = shown[str(logins[-1]["id"])]
    assert cell(newest, "actor") == logins[-1]["actor"] and cell(newest, "action") == "login"
    ids = [int(i) for i in shown]
    assert ids == sorted(ids, reverse=True)
    assert {"Audit", "Users"} <= set(nav_links(doc))


def test_audit_pages_older_entries_without_losing_any(system: System, browser: Browser) -> None:
    """With more entries than a page, the newest page holds the last ones and Older pages reach every other one."""
    for i in range(audit_page.PER_PAGE + 5):  # each a refused, audited change: cheap and leaves nothing behind
        system.request("DELETE", f"/api/v1/keys/key-none-{i}")
    browser.log_in("admin", system.admin_password)  # itself an entry: logged in before the log is read
    everything = [e["id"] for e in system.get("/api/v1/audit?limit=10000")["items"]]
    seen: list[int] = []
    path: str | None = "/ui/audit"
    while path:
        doc = page(browser.request("GET", path))
        seen += [int(r.attrs["data-audit"]) for r in rows(doc, "data-audit")]
        older = doc.by_id("audit-older")
        path = older.attrs["href"] if older is not None else None
    assert seen[:audit_page.PER_PAGE] == sorted(everything, reverse=True)[:audit_page.PER_PAGE]
    assert sorted(seen) == sorted(set(seen)) and set(everything) <= set(seen)


def test_users_page_creates_shows_password_once_and_deletes(system: System, browser: Browser) -> None:
    """An admin creates a viewer on the page, sees its password once (and it logs in), changes its role, deletes it."""
    browser.log_in("admin", system.admin_password)
    resp = browser.request("GET", "/ui/users")
    assert resp.status_code == 200 and "llmgw · Users" in resp.text
    assert "admin" in {r.attrs["data-user"] for r in rows(page(resp), "data-user")}
    made = browser.request("POST", "/ui/users", data={"name": "uma", "role": "viewer"})
    assert made.status_code == 201, made.text
    doc = page(made)
    password_el = doc.by_id("new-user-password")
    assert password_el is not None and password_el.text
    password = password_el.text
    assert {"name": "uma", "role": "viewer"}.items() <= {u["name"]: u for u in system.get(
        "/api/v1/users")["items"]}["uma"].items()
    token = httpx.post(f"{system.url}/api/v1/login", json={"username": "uma", "password": password},
                       trust_env=False, timeout=30)
    assert token.status_code == 200, token.text
    again = browser.request("GET", "/ui/users")
    assert password not in again.text and page(again).by_id("new-user") is None

    moved = browser.request("POST", "/ui/users/uma/role", data={"role": "operator"})
    assert moved.status_code == 303 and moved.headers["location"] == "/ui/users"
    assert {u["name"]: u["role"] for u in system.get("/api/v1/users")["items"]}["uma"] == "operator"

    gone = browser.request("POST", "/ui/users/uma/delete")
    assert gone.status_code == 303 and gone.headers["location"] == "/ui/users"
    assert "uma" not in {r.attrs["data-user"] for r in rows(page(browser.request("GET", "/ui/users")), "data-user")}
    assert "uma" not in {u["name"] for u in system.get("/api/v1/users")["items"]}


def test_users_page_shows_a_refusal_in_words(system: System, browser: Browser) -> None:
    """Deleting the last administrator on the page shows the API's own sentence, not a status code."""
    browser.log_in("admin", system.admin_password)
    resp = browser.request("POST", "/ui/users/admin/delete")
    error = page(resp).by_id("users-error")
    assert resp.status_code == 409 and error is not None and "last administrator" in error.text


def test_viewer_gets_the_apis_403_sentence_on_both(system: System, browser: Browser) -> None:
    """A viewer's audit and users pages show the API's 403 message, no control, no Audit/Users link; posts refused."""
    made = system.request("POST", "/api/v1/users", json={"name": "vic", "role": "viewer"})
    assert made.status_code == 201, made.text
    password = made.json()["password"]
    token = httpx.post(f"{system.url}/api/v1/login", json={"username": "vic", "password": password},
                       trust_env=False, timeout=30).json()["token"]
    browser.log_in("vic", password)
    for path, api_path, error_id in (("/ui/audit", "/api/v1/audit", "audit-error"),
                                     ("/ui/users", "/api/v1/users", "users-list-error")):
        api = httpx.get(f"{system.url}{api_path}", headers={"authorization": f"Bearer {token}"}, trust_env=False,
                        timeout=30)
        assert api.status_code == 403, api.text
        resp = browser.request("GET", path)
        doc = page(resp)
        error = doc.by_id(error_id)
        assert resp.status_code == 403 and error is not None, (path, resp.status_code)
        assert error.text == " ".join(api.json()["error"]["message"].split())
        assert not mutating(doc) and not {"Audit", "Users"} & set(nav_links(doc))
    posted = browser.request("POST", "/ui/users", data={"name": "sneak", "role": "admin"})
    assert posted.status_code == 403 and page(posted).by_id("users-error") is not None
    assert "sneak" not in {u["name"] for u in system.get("/api/v1/users")["items"]}
