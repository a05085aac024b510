"""The UI's node pages against a real server and agent: node list, inventory, agent log, cordon/uncordon.

Driven with ``llmgw.testing.uiclient`` (httpx as a browser, the page parsed into a tree), as test_ui_pages is.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System, sim_model
from llmgw.testing.uiclient import Browser, Node, logged_in, page

MODEL = "sim-node"
SYSFS = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs" / "class" / "infiniband"


def port_row(doc: Node, name: str) -> str:
    """An IB port's row (``[data-port="ADAPTER/PORT"]``), as text."""
    found = doc.find(lambda n: n.attrs.get("data-port") == name)
    assert found is not None, f"no [data-port={name!r}]"
    return found.text


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent (node1) and Ready sim model for the module (a server start is seconds)."""
    # The agent reads InfiniBand adapters from this sysfs copy (two adapters, one port of mlx5_1 DOWN).
    env = {"LLMGW_AGENT_DISCOVERY__SYSFS_ROOT": str(SYSFS)}
    with system_mod.running(tmp_path_factory.mktemp("uinode"), agent_env=env) as s:
        s.apply(sim_model(MODEL))
        s.wait_model(MODEL)
        yield s


@pytest.fixture
def viewer(system: System) -> Iterator[Browser]:
    made = system.request("POST", "/api/v1/users", json={"name": "nora", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    b = logged_in(system.url, made.json()["name"], made.json()["password"])
    try:
        yield b
    finally:
        b.close()


def test_list_links_each_node_to_its_page(admin: Browser) -> None:
    """/ui/nodes lists node1 Ready with a link to /ui/nodes/node1; the overview links the node id there too; the
    node pages send an anonymous caller to the login."""
    resp = admin.request("GET", "/ui/nodes")
    assert resp.status_code == 200 and "<title>llmgw · Nodes</title>" in resp.text
    p = page(resp)
    assert "node1" in p.get("node-list").text and "Ready" in p.get("node-list").text
    assert "/ui/nodes/node1" in p.links()
    assert "/ui/nodes/node1" in page(admin.request("GET", "/ui/")).links()
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
    p = page(resp)
    assert p.get("inv-cpus").text == str(doc["cpu_count"])
    assert doc["model_dirs"] and doc["model_dirs"][0]["path"] in p.get("inv-disks").text
    for e in doc["engines"]:
        assert f"{e['name']} {e['version']}" in p.get("inv-engines").text
    assert MODEL in p.get("node-replicas").text and "Ready" in p.get("node-replicas").text
    ports = [(h["name"], q["port"], q["state"]) for h in doc["hcas"] for q in h["ports"]]
    assert ("mlx5_1", 2, "DOWN") in ports and ("mlx5_0", 1, "ACTIVE") in ports, ports
    for name, port, state in ports:
        assert state in port_row(p, f"{name}/{port}").split(), p.get("inv-ib").text
    assert "No GPU" in p.get("inv-gpus").text or doc["gpus"][0]["name"] in p.get("inv-gpus").text
    assert p.get("node-live").attrs["hx-get"] == "/ui/nodes/node1/live"
    assert p.get("agent-log").attrs["hx-get"] == "/ui/nodes/node1/log"
    assert "every 2s" in p.get("agent-log").attrs["hx-trigger"]
    assert p.mutating() == 3  # cordon, uncordon, the drain <details>
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
    assert "cordoned" in page(admin.request("GET", "/ui/nodes/node1")).get("node-state").text
    resp = admin.request("POST", "/ui/nodes/node1/uncordon")
    assert resp.status_code == 303, resp.text
    assert system.get("/api/v1/nodes/node1/describe")["cordoned"] is False
    assert "schedulable" in page(admin.request("GET", "/ui/nodes/node1")).get("node-state").text


def test_viewer_sees_no_control_and_gets_the_403_in_words(system: System, viewer: Browser) -> None:
    """A viewer's node page has no [data-mutating]; a cordon POST anyway shows the API's 403 message, and the node
    stays schedulable."""
    resp = viewer.request("GET", "/ui/nodes/node1")
    assert resp.status_code == 200 and page(resp).mutating() == 0
    assert "schedulable" in page(resp).get("node-state").text
    api = viewer.client.post("/api/v1/nodes/node1/cordon", headers=viewer.cookie_header())
    assert api.status_code == 403, api.text
    resp = viewer.request("POST", "/ui/nodes/node1/cordon")
    assert resp.status_code == 403
    shown = page(resp).get("node-error").text
    assert shown and shown == " ".join(api.json()["error"]["message"].split())
    assert system.get("/api/v1/nodes/node1/describe")["cordoned"] is False


def test_one_node_reads_as_its_entry_of_the_list(system: System) -> None:
    """GET /api/v1/nodes/{id} is the document the list's entry for that node is (same fields, same inventory);
    an unknown id is a 404 whose message says how to list the nodes."""
    listed = system.get("/api/v1/nodes")["items"]
    one = system.get("/api/v1/nodes/node1")
    entry = next(n for n in listed if n["id"] == "node1")
    assert one.keys() == entry.keys()
    # What moves between two reads (a heartbeat, free memory, the live shards' load) aside, the two are equal.
    moving = {"last_seen", "memory_available_bytes", "load", "gpus", "model_dirs"}
    assert {k: v for k, v in one.items() if k not in moving} == {k: v for k, v in entry.items() if k not in moving}
    assert [g["index"] for g in one["gpus"]] == [g["index"] for g in entry["gpus"]]
    assert one["hcas"] and one["engines"] and one["model_dirs"]
    missing = system.request("GET", "/api/v1/nodes/nope")
    assert missing.status_code == 404
    message = missing.json()["error"]["message"]
    assert "nope" in message and "llmgw get nodes" in message, message
