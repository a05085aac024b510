"""The history charts in a real browser (Debian's Chromium): the overview, a model's page and a node's page draw
what the leader recorded from the router's reports and the agent's heartbeats, and the overview's charts grow
with more traffic by themselves (htmx), with no reload. Screenshots go to the test artifact folder.

This machine has no GPU: the agent reads a captured ``nvidia-smi -q -x`` of two GPUs (0 % and 37 % busy), the
hardware it lacks, so the GPU memory and utilisation charts have data; the rest is real."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import Page, expect

from llmgw.testing import browser, procs, system

pytestmark = pytest.mark.slow

# Waits, not timings: a bucket is 10 s and the charts refresh every 5 s; the margin is for a loaded CI machine.
LIVE_S = 60.0
MODEL = "charted"
NVIDIA_SMI_XML = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi-q-x-2gpu.xml"


@pytest.fixture(scope="module")
def ui_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[system.System]:
    """The shared fixture's server and node1, whose agent reads its GPUs from the fixture (a Python script that
    prints it: no shell)."""
    root = tmp_path_factory.mktemp("test_ui_charts")
    smi = root / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(NVIDIA_SMI_XML)!r}).read())\n")
    smi.chmod(0o755)
    env = {"LLMGW_AGENT_DISCOVERY__PREFER_NVML": "false", "LLMGW_AGENT_DISCOVERY__NVIDIA_SMI": str(smi)}
    with system.running(root / "cluster", agent_env=env) as s:
        yield s


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    ui_system.apply(system.sim_model(MODEL))
    ui_system.wait_model(MODEL, timeout=LIVE_S)
    ui_system.wait_router(MODEL, 1, timeout=LIVE_S)
    return ui_system


def traffic(s: system.System, n: int) -> None:
    """``n`` streamed chat completions through the server's router with the real ``openai`` client."""
    client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", timeout=30, max_retries=0)
    for i in range(n):
        stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=8,
                                                messages=[{"role": "user", "content": f"hello {i}"}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def wait_for(page: Page, selector: str, predicate_js: str) -> None:
    """Until the chart at ``selector`` exists and ``predicate_js`` (given the <svg>) holds; htmx redraws it."""
    js = f"() => {{ const el = document.querySelector({selector!r}); return !!el && ({predicate_js})(el); }}"
    page.wait_for_function(js, timeout=LIVE_S * 1000)


def test_overview_model_and_node_charts_show_data_and_grow_live(cluster: system.System,
                                                                 chrome: browser.Browser) -> None:
    traffic(cluster, 6)
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    requests, cpu = "#overview-charts svg#ov-requests", "#overview-charts svg#ov-cpu"
    wait_for(page, requests, "el => Number(el.dataset.sum) > 0")
    wait_for(page, cpu, "el => Number(el.dataset.points) > 0")
    wait_for(page, "#overview-charts svg#ov-gpu-util", "el => Number(el.dataset.sum) > 0")  # mean of 0 and 37 %
    expect(page.locator(f"{requests} text.legend", has_text=MODEL)).to_have_count(0)  # one line: no legend
    expect(page.locator(f"{requests} circle.point title").first).to_contain_text("UTC")
    # More traffic, and the open page's chart takes it in without a reload (a marker set now survives): a newer
    # bucket above 0 appears (a rate's sum is no measure: the bucket holding now is a rate over its elapsed time).
    page.evaluate("() => { window.llmgwNoReload = 1; }")
    before = int(page.locator(requests).get_attribute("data-newest") or 0)
    assert before > 0

    def newer() -> bool:
        traffic(cluster, 2)
        return int(page.locator(requests).get_attribute("data-newest") or 0) > before

    procs.wait_for(newer, timeout=LIVE_S, interval=0.5, what="a newer bucket of requests drawn on the open page")
    assert page.evaluate("() => window.llmgwNoReload") == 1
    assert chrome.csp_violations == []
    shot = chrome.screenshot(page, "overview")
    assert shot.stat().st_size > 10_000

    page.goto(f"/ui/models/{MODEL}")
    wait_for(page, "#model-charts svg#chart-model-0", "el => Number(el.dataset.sum) > 0")  # requests/s
    wait_for(page, "#model-charts svg#chart-model-1", "el => Number(el.dataset.points) > 0")  # TTFT p50..p99
    wait_for(page, "#model-charts svg#chart-model-2", "el => Number(el.dataset.sum) > 0")  # tokens in (metered)
    expect(page.locator("#model-charts svg#chart-model-4")).to_have_attribute("aria-label", "Replicas")
    wait_for(page, "#model-charts svg#chart-model-4", "el => Number(el.dataset.sum) > 0")  # one Ready, sampled
    chrome.screenshot(page, "model")

    page.goto("/ui/nodes/node1?window=5m")
    wait_for(page, "#node-charts svg#chart-node-0", "el => Number(el.dataset.points) > 0")  # CPU
    wait_for(page, "#node-charts svg#chart-node-1", "el => Number(el.dataset.sum) > 0")  # memory used
    expect(page.locator("#node-charts svg#chart-node-3")).to_have_attribute("aria-label", "GPU memory")
    util = "#node-charts svg#chart-node-4"  # beside GPU memory: a line per GPU, the first (gpu0) at 0 %
    expect(page.locator(util)).to_have_attribute("aria-label", "GPU utilisation")
    wait_for(page, util, "el => Number(el.dataset.points) >= 2")
    expect(page.locator(f"{util} circle.point title", has_text="gpu1: 37%").first).to_be_attached()
    expect(page.locator('#inv-gpus tr[data-gpu="1"] td.gpu-util')).to_have_text("37%")
    expect(page.locator("#h-node-charts strong")).to_have_text("5m")
    assert chrome.csp_violations == []
    chrome.screenshot(page, "node")


def test_the_history_is_a_viewers_read_over_http(cluster: system.System) -> None:
    """``GET /api/v1/metrics/history`` over the server's real HTTP: a viewer reads a model's and a node's series
    (typed, with data after traffic); no credential is refused; a bad window is refused naming it."""
    made = cluster.request("POST", "/api/v1/users", json={"name": "chart-viewer", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    with httpx.Client(base_url=cluster.url, timeout=30, trust_env=False) as c:
        login = c.post("/api/v1/login", json={"username": "chart-viewer", "password": made.json()["password"]})
        assert login.status_code == 200, login.text
        auth = {"Authorization": f"Bearer {login.json()['token']}"}
        traffic(cluster, 3)

        def model_doc() -> dict | None:  # type: ignore[type-arg]
            r = c.get("/api/v1/metrics/history", params={"scope": "model", "name": MODEL, "window": "5m"},
                      headers=auth)
            assert r.status_code == 200, r.text
            doc = r.json()
            reqs = next((ch for ch in doc["charts"] if ch["title"] == "Requests"), None)
            return doc if reqs and any(v for v in reqs["lines"][0]["values"] if v) else None

        doc = procs.wait_for(model_doc, timeout=LIVE_S, interval=1, what="the model's requests in its history")
        assert doc["step_s"] == 10 and len(doc["times"]) == 30 and doc["recorded"] is True
        node = c.get("/api/v1/metrics/history", params={"scope": "node", "name": "node1"}, headers=auth).json()
        assert node["window"] == "1h" and [ch["title"] for ch in node["charts"]][:3] == ["CPU", "Memory used",
                                                                                        "Disk used"]
        assert c.get("/api/v1/metrics/history", params={"scope": "node", "name": "node1"}).status_code == 401
        bad = c.get("/api/v1/metrics/history", params={"scope": "model", "name": MODEL, "window": "2d"}, headers=auth)
        assert bad.status_code == 422 and "window" in bad.text
