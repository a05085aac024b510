"""The Projects pages against a real server: an admin creates a project, sets its limits and adds its owner
on the page; the owner sees it with its members, limits, keys and the link to its usage, and no limits
form; someone outside it gets the API's 404 sentence. Driven with httpx as the other UI tests are."""

from __future__ import annotations

from llmgw.testing.system import System
from llmgw.testing.uiclient import Browser, logged_in, page


def _user(system: System, name: str) -> str:
    made = system.request("POST", "/api/v1/users", json={"name": name, "role": "viewer"})
    assert made.status_code == 201, made.text
    return str(made.json()["password"])


def test_projects_page_create_limits_members_and_who_sees_what(system: System, admin: Browser) -> None:
    """Create, limits (a bad one refused in words, nothing changed) and a member through the pages."""
    owner_pw, outsider_pw = _user(system, "olga"), _user(system, "nora")
    made = admin.request("POST", "/ui/projects", data={"name": "team-ui", "description": "UI team"})
    assert made.status_code == 303 and made.headers["location"].endswith("/projects/team-ui"), made.text
    listing = page(admin.request("GET", "/ui/projects"))
    assert listing.find(lambda n: n.attrs.get("data-project") == "team-ui") is not None
    assert listing.by_id("create-project") is not None

    bad = admin.request("POST", "/ui/projects/team-ui/limits", data={"tokens_per_day": "lots"})
    error = page(bad).by_id("project-error")
    assert bad.status_code == 422 and error is not None and "limits.tokens_per_day" in error.text
    assert system.get("/api/v1/projects/team-ui")["limits"] == {}
    ok = admin.request("POST", "/ui/projects/team-ui/limits", data={"tokens_per_day": "20000", "requests_per_day": ""})
    assert ok.status_code == 303, ok.text
    assert system.get("/api/v1/projects/team-ui")["limits"] == {"tokens_per_day": 20000}
    added = admin.request("POST", "/ui/projects/team-ui/member", data={"user": "olga", "role": "owner"})
    assert added.status_code == 303, added.text
    key = system.request("POST", "/api/v1/keys", json={"name": "svc", "project": "team-ui"}).json()

    owner = logged_in(system.url, "olga", owner_pw)
    try:
        resp = owner.request("GET", "/ui/projects/team-ui")
        doc = page(resp)
        assert resp.status_code == 200 and "Project team-ui" in resp.text
        assert doc.find(lambda n: n.attrs.get("data-member") == "olga") is not None
        assert doc.find(lambda n: n.attrs.get("data-key") == key["id"]) is not None
        usage = doc.by_id("project-usage")
        assert usage is not None and usage.attrs["href"].endswith("/usage?project=team-ui")
        assert doc.by_id("project-limits") is None and "tokens_per_day" in doc.get("limits").text
        assert doc.by_id("add-member") is not None  # an owner manages members
        assert page(owner.request("GET", "/ui/projects")).by_id("create-project") is None
    finally:
        owner.close()
    outsider = logged_in(system.url, "nora", outsider_pw)
    try:
        hidden = outsider.request("GET", "/ui/projects/team-ui")
        assert hidden.status_code == 404 and "team-ui&#39; does not exist" in hidden.text
        assert "team-ui" not in outsider.request("GET", "/ui/projects").text
    finally:
        outsider.close()
