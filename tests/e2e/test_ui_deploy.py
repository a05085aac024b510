"""The "Deploy a model" page in a real browser: Debian's Chromium (llmgw/testing/browser.py) against a real server,
two real agents and a local hub (a real ``llmgw mirror``; never the internet). A model too big for every node
shows each node's reason; one that fits shows the node it lands on, and applying its model file makes the model.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, deployhub, system

pytestmark = pytest.mark.slow

GGUF = f"{deployhub.GGUF_REPO}/{deployhub.GGUF_FILE}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[system.System]:
    work = tmp_path_factory.mktemp("ui-deploy")
    with deployhub.running(work) as hub:
        s = system.System(work, server_args=["--hub-endpoint", hub, "--mirror-url", hub])
        try:
            s.start_server()
            s.start_agent("node1")
            s.start_agent("node2")
            yield s
        finally:
            s.close()


def _preview(page: sync_api.Page, source: str, *, context: str = "", concurrency: str = "1") -> None:
    page.locator("#deploy-source").fill(source)
    page.locator("#deploy-context").fill(context)
    page.locator("#deploy-concurrency").fill(concurrency)
    page.locator("#preview-button").click()
    expect(page.locator("#placement")).to_be_visible()


def test_too_big_shows_each_nodes_reason_then_one_that_fits_lands_and_applies(
        cluster: system.System, chrome: browser.Browser) -> None:
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.locator("nav a", has_text="Deploy").click()
    expect(page).to_have_title("llmgw · Deploy a model")
    expect(page.locator("#catalog tr[data-catalog]")).not_to_have_count(0)
    chrome.screenshot(page, "catalog")

    _preview(page, GGUF, context="1000000", concurrency="1024")
    expect(page.locator("#metadata .architecture")).to_have_text("llama")
    expect(page.locator("#memory tr[data-engine=llamacpp]")).to_be_visible()
    expect(page.locator("#placement-summary")).to_contain_text("0 of 1 replicas placed; each needs ")
    for node in ("node1", "node2"):
        expect(page.locator(f"#placement tr[data-node={node}] .why")).to_contain_text("free memory, needs")
    expect(page.locator("#placement tr[data-lands]")).to_have_count(0)
    chrome.screenshot(page, "too big")

    _preview(page, GGUF, context="2048")
    landed = page.locator("#placement tr[data-lands]")
    expect(landed).to_have_count(1)
    expect(landed.locator(".why")).to_have_text("lands here")
    node = landed.get_attribute("data-node")
    assert node in ("node1", "node2")
    other = "node2" if node == "node1" else "node1"
    expect(page.locator(f"#placement tr[data-node={other}] .why")).to_have_text("fits (the placer chose another node)")
    editor = page.locator("#spec-editor")
    assert "engine: llamacpp" in editor.input_value() and "--ctx-size" in editor.input_value()
    chrome.screenshot(page, "fits")

    page.locator("#apply-button").click()
    page.wait_for_url("**/ui/models/tiny-llama-f32")
    expect(page).to_have_title("llmgw · Model tiny-llama-f32")
    assert [m["metadata"]["name"] for m in cluster.get("/api/v1/models")["items"]] == ["tiny-llama-f32"]
    chrome.screenshot(page, "applied")


def test_a_catalog_entry_previews_and_a_bad_source_is_said_in_words(
        cluster: system.System, chrome: browser.Browser) -> None:
    page = chrome.page(base_url=cluster.url)
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.goto("/ui/deploy")
    _preview(page, f"hf://{deployhub.ST_REPO}", context="4096")
    expect(page.locator("#metadata .architecture")).to_have_text("LlamaForCausalLM")
    for node in ("node1", "node2"):
        expect(page.locator(f"#placement tr[data-node={node}] .why")).to_contain_text("lacks engine vllm")
    page.locator("#deploy-source").fill("/etc/shadow")
    page.locator("#preview-button").click()
    expect(page.locator("#deploy-error")).to_contain_text("no node reports weights at /etc/shadow")
    assert page.locator("#deploy-source").input_value() == "/etc/shadow"
    # A catalog entry's button posts its source: the hub here has none of them, so the refusal says so.
    page.locator("#catalog tr[data-catalog] button.preview").first.click()
    expect(page.locator("#deploy-error")).to_contain_text("cannot read the metadata of hf://")
    chrome.screenshot(page, "catalog entry unreadable")
