"""The UI's node pages against a real server and agent: node list, inventory, agent log, cordon/uncordon.

Driven with httpx, the browser's part played by hand (as in test_ui_pages): the session cookie is
``Secure``, so each request carries it in its ``Cookie`` header, and POSTs carry the browser's Origin.
"""

from __future__ import annotations

import html
import html.parser
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System, sim_model

MODEL = "sim-node"
SYSFS = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs" / "class" / "infiniband"
VOID = {"meta", "link", "input", "br", "img", "hr", "source", "wbr", "col", "area", "base", "embed", "track"}


class Page(html.parser.HTMLParser):
    """What the tests read of a page: each id'd element's text and attributes, and the data-mutating count."""

    def __init__(self, resp: httpx.Response) -> None:
        super().__init__()
        assert "text/html" in resp.headers["content-type"], resp.headers
        self.text: dict[str, str] = {}
        self.attrs: dict[str, dict[str, str]] = {}
        self.mutating = 0
        self.links: list[str] = []
        self._open: list[tuple[str, str]] = []  # (tag, id) of open elements that have an id
        self.feed(resp.text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.mutating += "data-mutating" in a
        if tag == "a":
            self.links.append(a.get("href", ""))
        # An IB port's row is read as if its id were "port:ADAPTER/PORT".
        key = a.get("id") or (f"port:{a['data-port']}" if "data-port" in a else "")
        if key and tag not in VOID:
            self._open.append((tag, key))
            self.text.setdefault(key, "")
            self.attrs[key] = a

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for _, id_ in self._open:
            self.text[id_] += data

    def words(self, id_: str) -> str:
        return " ".join(self.text[id_].split())


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent (node1) and Ready sim model for the module (a server start is seconds)."""
    # The agent reads InfiniBand adapters from this sysfs copy (two adapters, one port of mlx5_1 DOWN).
    env = {"LLMGW_AGENT_DISCOVERY__SYSFS_ROOT": str(SYSFS)}
    with system_mod.running(tmp_path_factory.mktemp("uinode"), agent_env=env) as s:
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
def viewer(system: System) -> Iterator[Browser]:
    made = system.request("POST", "/api/v1/users", json={"name": "nora", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    b = Browser(system, made.json()["name"], made.json()["password"])
    try:
        yield b
    finally:
        b.client.close()


def test_list_links_each_node_to_its_page(admin: Browser) -> None:
    """/ui/nodes lists node1 Ready with a link to /ui/nodes/node1; the overview links the node id there too; the
    node pages send an anonymous caller to the login."""
    resp = admin.request("GET", "/ui/nodes")
    assert resp.status_code == 200 and "<title>llmgw · Nodes</title>" in resp.text
    p = Page(resp)
    assert "node1" in p.words("node-list") and "Ready" in p.words("node-list")
    assert "/ui/nodes/node1" in p.links
    assert "/ui/nodes/node1" in Page(admin.request("GET", "/ui/")).links
    for path in ("/ui/nodes", "/ui/nodes/node1", "/ui/nodes/node1/live", "/ui/nodes/node1/log"):
        anon = admin.client.get(path)  # no cookie: anonymous
        assert anon.status_code == 303 and anon.headers["location"] == "/ui/login", path


def test_node_page_shows_inventory_replicas_and_agent_log(system: System, admin: Browser) -> None:
    """The node page shows the inventory the REST API reports (CPUs, IB ports and their state, model directory,
    engines), the sim replica on it, live parts polled by htmx every 2 s, and the agent log's fragment has the
    agent's own lines."""
    doc = system.get("/api/v1/nodes")["items"][0]
    resp = admin.request("GET", "/ui/nodes/node1")
    assert resp.status_code == 200 and "<title>llmgw · Node node1</title>" in resp.text
    p = Page(resp)
    assert p.words("inv-cpus") == str(doc["cpu_count"])
    assert doc["model_dirs"] and doc["model_dirs"][0]["path"] in p.words("inv-disks")
    for e in doc["engines"]:
        assert f"{e['name']} {e['version']}" in p.words("inv-engines")
    assert MODEL in p.words("node-replicas") and "Ready" in p.words("node-replicas")
    ports = [(h["name"], q["port"], q["state"]) for h in doc["hcas"] for q in h["ports"]]
    assert ("mlx5_1", 2, "DOWN") in ports and ("mlx5_0", 1, "ACTIVE") in ports, ports
    for name, port, state in ports:
        assert state in p.words(f"port:{name}/{port}").split(), p.words("inv-ib")
    assert "No GPU" in p.words("inv-gpus") or doc["gpus"][0]["name"] in p.words("inv-gpus")
    assert p.attrs["node-live"]["hx-get"] == "/ui/nodes/node1/live"
    assert p.attrs["agent-log"]["hx-get"] == "/ui/nodes/node1/log"
    assert "every 2s" in p.attrs["agent-log"]["hx-trigger"]
    assert p.mutating == 3  # cordon, uncordon, the drain <details>
    shown = html.unescape(admin.request("GET", "/ui/nodes/node1/log").text).splitlines()
    api = system.request("GET", "/api/v1/nodes/node1/logs", params={"lines": "400"})
    lines = [x for raw in api.text.splitlines() if raw.strip() for x in json.loads(raw).get("lines", [])]
    assert lines and 0 < len(shown) <= 200, shown
    assert set(shown) <= set(lines), (shown[:5], lines[:5])
    assert admin.request("GET", "/ui/nodes/nope").status_code == 404


def test_admin_cordons_and_uncordons(system: System, admin: Browser) -> None:
    """Cordon (the form's POST) marks node1 cordoned as the REST API then says; uncordon clears it again."""
    resp = admin.request("POST", "/ui/nodes/node1/cordon")
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/nodes/node1", resp.text
    assert system.get("/api/v1/nodes/node1/describe")["cordoned"] is True
    assert "cordoned" in Page(admin.request("GET", "/ui/nodes/node1")).words("node-state")
    resp = admin.request("POST", "/ui/nodes/node1/uncordon")
    assert resp.status_code == 303, resp.text
    assert system.get("/api/v1/nodes/node1/describe")["cordoned"] is False
    assert "schedulable" in Page(admin.request("GET", "/ui/nodes/node1")).words("node-state")


def test_viewer_sees_no_control_and_gets_the_403_in_words(system: System, viewer: Browser) -> None:
    """A viewer's node page has no [data-mutating]; a cordon POST anyway shows the API's 403 message, and the node
    stays schedulable."""
    resp = viewer.request("GET", "/ui/nodes/node1")
    assert resp.status_code == 200 and Page(resp).mutating == 0
    assert "schedulable" in Page(resp).words("node-state")
    api = viewer.client.post("/api/v1/nodes/node1/cordon",
                             headers={"origin": viewer.url,
                                      "cookie": "; ".join(f"{k}={v}" for k, v in viewer.cookies.items())})
    assert api.status_code == 403, api.text
    resp = viewer.request("POST", "/ui/nodes/node1/cordon")
    assert resp.status_code == 403
    shown = Page(resp).words("node-error")
    assert shown and shown == " ".join(api.json()["error"]["message"].split())
    assert system.get("/api/v1/nodes/node1/describe")["cordoned"] is False
