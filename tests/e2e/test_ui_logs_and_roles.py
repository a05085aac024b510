"""A replica's log followed live, and what a viewer may do, in a real browser (Debian's Chromium,
llmgw/testing/browser.py) against a real ``llmgw server``, agent (node1) and sim engine.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``).
"""

from __future__ import annotations

import re
import uuid

import pytest
import yaml
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

MODEL = "sim-follow"
# Waits, not timings: a sim replica is Ready within seconds here, and a line written to an engine's log reaches
# the agent's follow within its poll; the margin is for a loaded CI machine.
LIVE_S = 45.0


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    """The module's system with one Ready sim model."""
    ui_system.apply(system.sim_model(MODEL))
    ui_system.wait_model(MODEL, timeout=LIVE_S)
    return ui_system


def test_follow_streams_a_new_log_line_into_the_page_without_polling(cluster: system.System,
                                                                     chrome: browser.Browser) -> None:
    """On a replica's log page, Follow reads the API's follow stream: a line the engine's log gets afterwards
    appears in #replica-log, and no 2 s re-read of the log is requested meanwhile; Stop goes back to re-reading."""
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.goto(f"/ui/models/{MODEL}")
    page.locator("#replicas a.logs").first.click()
    page.wait_for_url(re.compile(r".*/replicas/[^/]+/logs$"))
    expect(page.locator("#replica-log")).not_to_be_empty(timeout=LIVE_S * 1000)

    polled: list[str] = []
    page.on("request", lambda r: polled.append(r.url) if r.url.endswith("/logs/tail") else None)
    page.locator("#follow").click()
    expect(page.locator("#follow")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#follow-state")).to_contain_text("following")
    page.wait_for_timeout(500)  # the stream's first batch (the last lines) has come and replaced the snapshot
    polled.clear()

    shard = cluster.replicas(MODEL)[0]["shard"]
    log_file = next(cluster.root.rglob(f"{shard}.log"))
    marker = f"ui-follow-marker-{uuid.uuid4().hex[:8]}"
    with log_file.open("a") as f:
        f.write(f"{marker}\n")
    expect(page.locator("#replica-log")).to_contain_text(marker, timeout=LIVE_S * 1000)
    chrome.screenshot(page, "log-followed")
    assert polled == [], f"the 2 s re-read ran while following: {polled}"
    assert page.locator("#replica-log").inner_text().count(marker) == 1

    page.locator("#follow").click()
    expect(page.locator("#follow")).to_have_attribute("aria-pressed", "false")
    with page.expect_request(re.compile(r".*/logs/tail$"), timeout=10_000):
        pass


def _viewer(cluster: system.System, name: str) -> str:
    made = cluster.request("POST", "/api/v1/users", json={"name": name, "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    return str(made.json()["password"])


def _post_apply(page: sync_api.Page, spec: str) -> sync_api.Response:
    """Submit a form to /ui/apply from the page, as a viewer's hand-made form would: the browser's cookie and
    Origin go with it, and the answer is the page the browser shows."""
    with page.expect_response(re.compile(r".*/ui/apply$")) as answer:
        page.evaluate("""(spec) => {
            const f = document.createElement("form");
            f.method = "post"; f.action = "/ui/apply";
            for (const [k, v] of [["op", "apply"], ["spec", spec]]) {
                const i = document.createElement("textarea"); i.name = k; i.value = v; f.appendChild(i);
            }
            document.body.appendChild(f); f.submit();
        }""", spec)
    return answer.value


def test_viewer_sees_no_control_and_a_posted_apply_is_refused_in_the_apis_words(cluster: system.System,
                                                                               chrome: browser.Browser) -> None:
    """A viewer's models list and model page carry no apply, scale or delete control ([data-mutating]); an apply
    posted anyway with the viewer's cookie answers 403 and the page says the API's sentence, not a code."""
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="vera", password=_viewer(cluster, "vera"))
    expect(page.locator("#user")).to_contain_text("viewer")
    page.goto("/ui/models")
    expect(page.locator(f'a[href="/ui/models/{MODEL}"]')).to_be_visible()
    assert page.locator("[data-mutating]").count() == 0
    assert page.locator('a[href="/ui/apply"]').count() == 0
    page.goto(f"/ui/models/{MODEL}")
    expect(page.locator("#replicas")).to_contain_text("Ready", timeout=LIVE_S * 1000)
    for control in ("[data-mutating]", "#scale-up", "#scale-down", "#delete", "#edit"):
        assert page.locator(control).count() == 0, control
    chrome.screenshot(page, "viewer-model-page")

    resp = _post_apply(page, yaml.safe_dump(system.sim_model("sim-by-viewer")))
    assert resp.status == 403
    error = page.locator("#editor-error")
    expect(error).to_be_visible()
    words = " ".join(error.inner_text().split())
    assert "POST /api/v1/models needs operator" in words and "llmgw user set-role vera operator" in words, words
    assert "403" not in words, words
    assert page.locator("[data-mutating]").count() == 0
    chrome.screenshot(page, "viewer-refused")
    assert cluster.request("GET", "/api/v1/models/sim-by-viewer").status_code == 404


def test_audit_page_shows_the_apply_an_admin_did_and_the_one_a_viewer_tried(cluster: system.System,
                                                                            chrome: browser.Browser) -> None:
    """An admin applies a model from the editor; the Audit page then lists it (actor the admin, action apply,
    the model named, ok), newest first above the refused apply a viewer tried before it."""
    viewer = chrome.page(base_url=cluster.url)
    browser.log_in(viewer, username="vic", password=_viewer(cluster, "vic"))
    assert _post_apply(viewer, yaml.safe_dump(system.sim_model("sim-tried"))).status == 403

    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.goto("/ui/apply")
    page.locator("#spec-editor").fill(yaml.safe_dump(system.sim_model("sim-audited", replicas=0)))
    page.get_by_role("button", name=re.compile("^Apply")).click()
    page.wait_for_url("**/ui/models/sim-audited")
    page.get_by_role("link", name="Audit").click()
    page.wait_for_url("**/ui/audit")
    expect(page).to_have_title("llmgw · Audit")
    rows = page.locator("#audit tbody tr")
    applied = rows.filter(has_text="sim-audited")
    expect(applied).to_have_count(1)
    assert "admin" in applied.locator(".actor").inner_text()
    assert applied.locator(".action").inner_text().strip() == "apply"
    assert applied.locator(".outcome").inner_text().strip() == "ok"
    # Refused before its body is read, so the try names the model kind, not the name the viewer sent.
    tried = rows.filter(has=page.locator(".actor", has_text="user:vic")).filter(
        has=page.locator(".action", has_text="apply"))
    expect(tried).to_have_count(1)
    assert tried.locator(".outcome").inner_text().strip() == "refused"
    texts = rows.all_inner_texts()
    assert ([i for i, t in enumerate(texts) if "sim-audited" in t][0]
            < [i for i, t in enumerate(texts) if "user:vic" in t][0]), texts
    chrome.screenshot(page, "audit")
    cluster.request("DELETE", "/api/v1/models/sim-audited")
