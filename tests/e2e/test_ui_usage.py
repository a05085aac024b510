"""The Usage page in a real browser (Debian's Chromium, llmgw/testing/browser.py) against a real ``llmgw server``:
charts drawn as inline SVG under the page's Content-Security-Policy, the table, the filters, and what a
project member may see. Rollup rows go straight into the server's store, as the ingest would write them.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``).
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from llmgw.control import datadir
from llmgw.control.store.tables import ProjectMemberRow
from llmgw.control.store.usagetables import UsageRollupRow
from llmgw.core import quota
from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

DAY, HOUR = 86400, 3600
PROJECTS = {"alpha": 1.0, "beta": 0.6, "gamma": 0.25}
MODELS = {"llama-3-8b": 1.0, "qwen-7b": 0.5, "mistral": 0.2}


@pytest.fixture(scope="module")
def usage_system(ui_system: system.System) -> system.System:
    """The module's system with ten days of usage for three projects and three models (hour and day rows that
    agree), a viewer ``ann`` who is a member of alpha."""
    made = ui_system.request("POST", "/api/v1/users", json={"name": "ann", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    ui_system.ann_password = str(made.json()["password"])  # type: ignore[attr-defined]
    now = int(time.time())
    hour_now = now // HOUR * HOUR
    rows = []
    for back in range(10):
        day = (now - back * DAY) // DAY * DAY
        at = min(day + 12 * HOUR, hour_now)
        for p, (project, pw) in enumerate(PROJECTS.items()):
            for m, (model, mw) in enumerate(MODELS.items()):
                n = int(50 * pw * mw * (1 + (back * 7 + p + m) % 5))
                if not n:
                    continue
                hist = [0] * (len(quota.TTFT_BUCKETS_MS) + 1)
                hist[quota.ttft_bucket(80 + 40 * ((back + m) % 6))] = n
                sums = {"requests": n, "errors": n // 20, "prompt_tokens": 900 * n, "cached_tokens": 200 * n,
                        "completion_tokens": 150 * n, "spend_micros": 1200 * n, "ttft_ms_sum": 100.0 * n,
                        "ttft_count": n, "duration_ms_sum": 900.0 * n, "ttft_hist": hist}
                for grain, start in (("h", at), ("d", day)):
                    rows.append(UsageRollupRow(grain=grain, start=start, project=project, key=f"key-{project}-{m}",
                                               model=model, user="", node="node1", **sums))
    store = datadir.open_store(ui_system.data_dir, ui_system.database)
    try:
        with store._session.begin() as s:
            s.add_all(rows)
            s.add(ProjectMemberRow(project="alpha", user="ann", role="member"))
    finally:
        store.close()
    return ui_system


def test_usage_page_draws_the_charts_and_the_table_and_filters_by_project(usage_system: system.System,
                                                                           chrome: browser.Browser) -> None:
    """The admin opens Usage from the nav: four SVG charts (tokens per day by project and by model, requests,
    TTFT p90) and a row per project; a project's link shows that project's usage per model over 30 days."""
    page = chrome.page(base_url=usage_system.url)
    browser.log_in(page, username="admin", password=usage_system.admin_password)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
    page.wait_for_url("**/ui/usage")
    expect(page).to_have_title("llmgw · Usage")
    for chart in ("tokens-by-project", "tokens-by-model", "requests"):
        expect(page.locator(f"#chart-{chart} svg rect.bar").first).to_be_visible()
    expect(page.locator("#chart-ttft-p90 svg polyline.line")).to_have_count(1)
    assert page.locator("#chart-tokens-by-project svg text.legend").all_text_contents() == list(PROJECTS)
    assert page.locator("#chart-tokens-by-project svg text.x-label").count() == 8  # 7 days and today's part
    expect(page.locator("#usage tbody tr")).to_have_count(3)
    assert page.locator("#usage tbody td.group").all_inner_texts() == list(PROJECTS)  # most tokens first
    chrome.screenshot(page, "usage")

    page.locator('#usage tr[data-group="alpha"] td.group a').click()
    page.wait_for_url("**/ui/usage?project=alpha*")
    expect(page.locator("h1")).to_have_text("Usage of project alpha")
    page.locator("#usage-filters select[name=since]").select_option("30d")
    page.locator("#usage-filters button").click()
    page.wait_for_url("**since=30d*")
    expect(page.locator("#usage tbody td.group")).to_have_text(list(MODELS))
    assert page.locator("#chart-tokens-by-project svg text.legend").all_text_contents() == ["alpha"]
    assert page.locator("#chart-requests svg rect.bar").count() == 10  # ten days with requests
    chrome.screenshot(page, "usage-alpha-30d")
    assert chrome.csp_violations == []

    phone = chrome.page(viewport=browser.PHONE, base_url=usage_system.url)
    browser.log_in(phone, username="admin", password=usage_system.admin_password)
    phone.goto("/ui/usage")
    expect(phone.locator("#chart-requests svg")).to_be_visible()
    chrome.screenshot(phone, "usage")


def test_a_member_sees_only_their_project_and_another_is_not_found(usage_system: system.System,
                                                                   chrome: browser.Browser) -> None:
    """ann (a viewer, member of alpha) sees alpha alone; asking for beta shows the API's 404 and no data."""
    page = chrome.page(base_url=usage_system.url)
    browser.log_in(page, username="ann", password=usage_system.ann_password)  # type: ignore[attr-defined]
    page.goto("/ui/usage")
    assert page.locator("#usage tbody td.group").all_inner_texts() == ["alpha"]
    assert page.locator("#chart-tokens-by-project svg text.legend").all_text_contents() == ["alpha"]
    chrome.screenshot(page, "member")
    answer = page.goto("/ui/usage?project=beta")
    assert answer is not None and answer.status == 404
    expect(page.locator("#usage-error")).to_contain_text("project 'beta'")
    expect(page.locator("#usage-charts")).to_have_count(0)
    chrome.screenshot(page, "member-refused")
