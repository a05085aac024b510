"""The overview's router traffic against a real server, agent and sim engine: rate, TTFT and errors, live.

The numbers come from the in-process router's own metrics, read by the UI over the API; requests go
through the server's router as any client's would.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System, sim_model
from llmgw.testing.uiclient import Browser, Node, page

MODEL = "sim-traffic"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent and Ready sim model; nothing has been sent through its router yet."""
    with system_mod.running(tmp_path_factory.mktemp("ui-traffic")) as s:
        s.apply(sim_model(MODEL))
        s.wait_model(MODEL)
        yield s


@pytest.fixture
def browser(system: System) -> Iterator[Browser]:
    b = Browser(system.url)
    try:
        b.log_in("admin", system.admin_password)
        yield b
    finally:
        b.close()


def _row(doc: Node, model: str) -> dict[str, str]:
    tr = doc.find(lambda n: n.tag == "tr" and n.attrs.get("data-traffic") == model)
    assert tr is not None, f"no traffic row for {model!r} in: {doc.text}"
    return {cls: c.text for c in tr.children for cls in c.attrs.get("class", "").split()}


def _stream(c: httpx.Client, model: str) -> int:
    with c.stream("POST", "/v1/chat/completions", json={
            "model": model, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}) as r:
        r.read()
        return r.status_code


def test_the_overview_shows_the_routers_rate_ttft_and_errors(system: System, browser: Browser) -> None:
    """No requests yet at first; after streamed completions and one for an unknown model, the next read shows a
    non-zero rate and TTFT for the model and the error under the unknown model and in the total."""
    overview = page(browser.request("GET", "/ui/"))
    div = overview.get("traffic")
    assert div.attrs["hx-get"] == "/ui/fragments/traffic" and div.attrs["hx-trigger"] == "every 2s"
    assert "No requests yet" in div.text
    with httpx.Client(base_url=system.url, timeout=30, trust_env=False) as c:
        codes = [_stream(c, MODEL) for _ in range(5)]
        unknown = c.post("/v1/chat/completions", json={"model": "no-such-model",
                                                       "messages": [{"role": "user", "content": "hi"}]})
    assert codes == [200] * 5 and unknown.status_code == 404
    doc = page(browser.request("GET", "/ui/fragments/traffic"))
    mine, other, total = _row(doc, MODEL), _row(doc, "(unknown model)"), _row(doc, "all models")
    assert (mine["requests"], mine["errors"]) == ("5", "0")
    assert float(mine["rate"]) > 0 and mine["ttft-p50"].endswith("ms") and mine["ttft-p99"].endswith("ms")
    assert (other["requests"], other["errors"], other["ttft-p50"]) == ("1", "1", "—")
    assert (total["requests"], total["errors"]) == ("6", "1")
    assert "6 requests since this server's router started" in doc.text


def test_a_viewer_sees_the_traffic_too(system: System) -> None:
    """The traffic is read with the browser's own credential: a viewer (who may read /metrics) gets the table."""
    made = system.request("POST", "/api/v1/users", json={"name": "vt", "role": "viewer"})
    assert made.status_code == 201, made.text
    b = Browser(system.url)
    try:
        b.log_in("vt", made.json()["password"])
        div = page(b.request("GET", "/ui/")).get("traffic")
    finally:
        b.close()
    assert div.find(lambda n: n.attrs.get("role") == "alert") is None, div.text  # no refusal in place of numbers
    assert "requests since this server's router started" in div.text or "No requests yet" in div.text


def test_metrics_restricted_by_name_and_whole(system: System) -> None:
    """/metrics?name[]= gives only the named series (the router's included); the whole scrape still counts
    replicas by phase."""
    system.wait_router(MODEL, 1)  # at least one request through the router, whatever ran before
    some = system.request("GET", "/metrics", params=[("name[]", "llmgw_router_requests_total"),
                                                     ("name[]", "llmgw_nodes_connected")])
    assert some.status_code == 200
    names = {line.split("{")[0].split(" ")[0] for line in some.text.splitlines() if not line.startswith("#")}
    assert names == {"llmgw_router_requests_total", "llmgw_nodes_connected"}, some.text
    whole = system.request("GET", "/metrics").text
    assert 'llmgw_replicas{phase="Ready"} 1.0' in whole and "llmgw_router_requests_total" in whole
