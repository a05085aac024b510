"""The UI's model page against a real server, agent and sim engine: spec, replicas, events, scale, delete.

Driven with httpx, the browser's part played by hand (as in test_ui_pages): the session cookie is
``Secure``, so each request carries it in its ``Cookie`` header, and POSTs carry the browser's Origin.
"""

from __future__ import annotations

import html.parser
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from llmgw.testing import system as system_mod
from llmgw.testing.system import System, sim_model

MODEL = "sim-mp"


class Page(html.parser.HTMLParser):
    """What the tests read of a page: each id'd element's text, the data-mutating count, replica rows' phases."""

    def __init__(self, resp: httpx.Response) -> None:
        super().__init__()
        assert "text/html" in resp.headers["content-type"], resp.headers
        self.text: dict[str, str] = {}
        self.mutating = 0
        self.phases: dict[str, str] = {}
        self.links: list[str] = []
        self._open: list[tuple[str, str]] = []  # (tag, id) of open elements that have an id
        self._replica = ""
        self._in_phase = False
        self.feed(resp.text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.mutating += "data-mutating" in a
        if tag == "a":
            self.links.append(a.get("href", ""))
        if "id" in a:
            self._open.append((tag, a["id"]))
            self.text.setdefault(a["id"], "")
        if tag == "tr" and "data-replica" in a:
            self._replica = a["data-replica"]
        self._in_phase = tag == "td" and "phase" in a.get("class", "").split() and bool(self._replica)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            self._open.pop()
        if tag == "td":
            self._in_phase = False
        if tag == "tr":
            self._replica = ""

    def handle_data(self, data: str) -> None:
        for _, id_ in self._open:
            self.text[id_] += data
        if self._in_phase:
            self.phases[self._replica] = self.phases.get(self._replica, "") + data.strip()


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent and Ready sim model for the module (a server start is seconds)."""
    with system_mod.running(tmp_path_factory.mktemp("uimodel")) as s:
        s.apply(sim_model(MODEL))
        s.wait_model(MODEL)
        yield s


class Browser:
    """httpx as a browser: no redirects followed, the session cookie kept by hand, Origin sent on POST."""

    def __init__(self, system: System, username: str, password: str) -> None:
        self.url = system.url
        self.client = httpx.Client(base_url=system.url, timeout=30, trust_env=False, follow_redirects=False)
        self.cookies: dict[str, str] = {}
        resp = self.request("POST", "/ui/login", data={"username": username, "password": password})
        assert resp.status_code == 303 and self.cookies, resp.text

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"accept": "text/html", **kw.pop("headers", {})}
        if method != "GET":
            headers["origin"] = self.url
        if self.cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        resp = self.client.request(method, path, headers=headers, **kw)
        for c in resp.headers.get_list("set-cookie"):
            name, _, rest = c.partition("=")
            value = rest.split(";", 1)[0].strip('"')
            if value and "max-age=0" not in c.lower():
                self.cookies[name] = value
        return resp


@pytest.fixture
def admin(system: System) -> Iterator[Browser]:
    b = Browser(system, "admin", system.admin_password)
    try:
        yield b
    finally:
        b.client.close()


@pytest.fixture
def viewer(system: System, request: pytest.FixtureRequest) -> Iterator[Browser]:
    # One system serves the module, so each test's viewer is a user of its own (a second "vic" is a 409).
    name = "vic-" + request.node.name.removeprefix("test_")[:20].replace("_", "-")
    made = system.request("POST", "/api/v1/users", json={"name": name, "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    b = Browser(system, made.json()["name"], made.json()["password"])
    try:
        yield b
    finally:
        b.client.close()


def test_page_shows_spec_replicas_and_events(admin: Browser) -> None:
    """The model page shows the spec as YAML, the replica Ready on node1 and the model's Created event; the
    live fragment carries the same, and the overview links the model's name to its page."""
    resp = admin.request("GET", f"/ui/models/{MODEL}")
    assert resp.status_code == 200, resp.text
    assert f"<title>llmgw · Model {MODEL}</title>" in resp.text
    p = Page(resp)
    assert "engine: sim" in p.text["spec"] and "replicas: 1" in p.text["spec"], p.text["spec"]
    assert list(p.phases.values()) == ["Ready"], p.phases
    assert "node1" in p.text["replicas"]
    assert "Created" in p.text["model-events"]
    assert p.mutating == 5  # the − form, the + form, the edit <details> and its Apply button, the delete <details>
    assert "name: sim-mp" in p.text["spec-editor"] and "engine: sim" in p.text["spec-editor"]
    live = Page(admin.request("GET", f"/ui/models/{MODEL}/live"))
    assert list(live.phases.values()) == ["Ready"] and "engine: sim" in live.text["spec"]
    assert f"/ui/models/{MODEL}" in Page(admin.request("GET", "/ui/")).links


def test_admin_scales_up_and_down(system: System, admin: Browser) -> None:
    """+ applies the spec with one replica more (the REST API then says 2), − brings it back to 1."""
    resp = admin.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "1"})
    assert resp.status_code == 303 and resp.headers["location"] == f"/ui/models/{MODEL}", resp.text
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 2
    assert "replicas: 2" in Page(admin.request("GET", f"/ui/models/{MODEL}")).text["spec"]
    resp = admin.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "-1"})
    assert resp.status_code == 303, resp.text
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 1


def test_viewer_sees_no_control_and_gets_the_403_in_words(system: System, viewer: Browser) -> None:
    """A viewer's page has no [data-mutating]; a scale POST anyway shows the API's 403 message, and nothing changes."""
    resp = viewer.request("GET", f"/ui/models/{MODEL}")
    assert resp.status_code == 200 and Page(resp).mutating == 0
    assert "engine: sim" in Page(resp).text["spec"]
    api = viewer.client.put(f"/api/v1/models/{MODEL}", json=sim_model(MODEL, replicas=2),
                            headers={"origin": viewer.url,
                                     "cookie": "; ".join(f"{k}={v}" for k, v in viewer.cookies.items())})
    assert api.status_code == 403, api.text
    resp = viewer.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "1"})
    assert resp.status_code == 403
    shown = " ".join(Page(resp).text["model-error"].split())
    assert shown == " ".join(api.json()["error"]["message"].split()) and shown
    resp = viewer.request("POST", f"/ui/models/{MODEL}/delete")
    assert resp.status_code == 403 and Page(resp).text["model-error"].strip()
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 1


def test_delete_removes_the_model(system: System, admin: Browser) -> None:
    """Delete (the confirm form's POST) removes the model and goes to the overview; its page then says why not."""
    system.apply(sim_model("sim-gone", replicas=0))
    resp = admin.request("POST", "/ui/models/sim-gone/delete")
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/", resp.text
    assert system.request("GET", "/api/v1/models/sim-gone").status_code == 404
    resp = admin.request("GET", "/ui/models/sim-gone")
    assert resp.status_code == 404 and "does not exist" in resp.text


def _text(p: Page, id_: str) -> str:
    return " ".join(p.text.get(id_, "").split())


def test_models_list_links_each_model_and_offers_apply_to_an_operator(admin: Browser, viewer: Browser) -> None:
    """/ui/models lists the model linked to its page with an "Apply a model" link; a viewer's list has no link to
    the editor (no [data-mutating]), and a viewer who posts to it anyway sees the API's 403 sentence."""
    p = Page(admin.request("GET", "/ui/models"))
    assert f"/ui/models/{MODEL}" in p.links and "/ui/apply" in p.links and p.mutating == 1
    v = Page(viewer.request("GET", "/ui/models"))
    assert f"/ui/models/{MODEL}" in v.links and "/ui/apply" not in v.links and v.mutating == 0
    posted = viewer.request("POST", "/ui/apply", data={"op": "apply", "spec": yaml.safe_dump(sim_model("sim-vic"))})
    assert posted.status_code == 403 and len(_text(Page(posted), "editor-error").split()) >= 3
    assert "403" not in _text(Page(posted), "editor-error") and Page(posted).mutating == 0


def test_bad_yaml_and_an_invalid_field_are_shown_in_words_keeping_the_text(system: System, admin: Browser) -> None:
    """YAML that does not parse and a manifest the API refuses each re-render the editor with #editor-error in
    words (the API's own message for the invalid field) and the user's text still in #spec-editor."""
    bad = "apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: broken\n"
    resp = admin.request("POST", "/ui/apply", data={"spec": bad, "op": "apply"})
    assert resp.status_code == 400
    p = Page(resp)
    assert "not valid YAML" in _text(p, "editor-error") and "line" in _text(p, "editor-error")
    assert p.text["spec-editor"] == bad

    invalid = yaml.safe_dump(sim_model("sim-bad", replicas="many"), sort_keys=False)
    api = system.request("POST", "/api/v1/models", json=sim_model("sim-bad", replicas="many"))
    assert api.status_code == 422, api.text
    resp = admin.request("POST", "/ui/apply", data={"spec": invalid, "op": "apply"})
    assert resp.status_code == 422
    p = Page(resp)
    assert _text(p, "editor-error") == " ".join(api.json()["error"]["message"].split()) and "replicas" in _text(
        p, "editor-error")
    assert p.text["spec-editor"] == invalid
    assert system.request("GET", "/api/v1/models/sim-bad").status_code == 404


def test_diff_shows_the_changed_line_without_applying(system: System, admin: Browser) -> None:
    """Diff of the current model with replicas 3 shows "-  replicas: 1" and "+  replicas: 3" in #diff, and
    the model still wants 1."""
    text = yaml.safe_dump(sim_model(MODEL, replicas=3), sort_keys=False)
    resp = admin.request("POST", "/ui/apply", data={"spec": text, "op": "diff"})
    assert resp.status_code == 200, resp.text
    diff = Page(resp).text["diff"]
    assert "\n-  replicas: 1\n" in diff and "\n+  replicas: 3\n" in diff, diff
    assert Page(resp).text["spec-editor"] == text
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 1


def test_apply_creates_the_model_which_becomes_ready_and_its_replica_log_has_lines(system: System,
                                                                                   admin: Browser) -> None:
    """Apply from the editor creates the model (303 to its page), it turns Ready through the REST API, and the
    replica's Logs link opens a page whose #replica-log (and its 2 s fragment) holds the engine's lines."""
    text = yaml.safe_dump(sim_model("sim-ed"), sort_keys=False)
    resp = admin.request("POST", "/ui/apply", data={"spec": text, "op": "apply"})
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/models/sim-ed", resp.text
    try:
        system.wait_model("sim-ed")
        p = Page(admin.request("GET", "/ui/models/sim-ed"))
        assert list(p.phases.values()) == ["Ready"], p.phases
        logs = [link for link in p.links if "/replicas/" in link and link.endswith("/logs")]
        assert len(logs) == 1, p.links
        page = Page(admin.request("GET", logs[0]))
        assert page.text["replica-log"].strip(), page.text
        tail = Page(admin.request("GET", logs[0] + "/tail"))
        assert len(tail.text["replica-log"].strip().splitlines()) >= 1
        missing = admin.request("GET", "/ui/models/sim-ed/replicas/nope/logs")
        assert missing.status_code == 404 and "no replica nope" in _text(Page(missing), "log-error")
    finally:
        system.request("DELETE", "/api/v1/models/sim-ed")
