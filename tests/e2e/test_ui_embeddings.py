"""The Playground's embeddings tab in a real browser (Debian's Chromium) against a real ``llmgw server``, agent
node1 and a sim engine, which answers ``/v1/embeddings`` with a deterministic 64-value vector.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``).
"""

from __future__ import annotations

import re

import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.sim import engine as sim_engine
from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

# Waits, not timings: a sim replica is Ready within a few seconds here; the margin is for a loaded CI machine.
LIVE_S = 45.0
MODEL = "embedder"


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    """The module's system with a sim model Ready behind the router."""
    ui_system.apply(system.sim_model(MODEL))
    ui_system.wait_model(MODEL, timeout=LIVE_S)
    ui_system.wait_router(MODEL, 1, timeout=LIVE_S)
    return ui_system


def _embeddings_tab(page: sync_api.Page, cluster: system.System) -> None:
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.get_by_role("link", name="Playground").click()
    page.wait_for_url("**/ui/playground")
    expect(page.locator("#embed-panel")).to_be_hidden()
    page.get_by_role("tab", name="Embeddings").click()
    expect(page.locator("#embed-panel")).to_be_visible()
    expect(page.locator("#chat-panel")).to_be_hidden()
    expect(page.get_by_role("tab", name="Embeddings")).to_have_attribute("aria-selected", "true")


def _embed(page: sync_api.Page, text: str) -> None:
    done = page.locator("#embed-form").get_attribute("data-done") or "0"
    page.locator("#embed-input").fill(text)
    page.locator("#embed-send").click()
    expect(page.locator("#embed-form")).to_have_attribute("data-done", str(int(done) + 1), timeout=LIVE_S * 1000)


def test_embeddings_tab_shows_dimension_values_time_and_the_request(
        cluster: system.System, chrome: browser.Browser) -> None:
    """On the Embeddings tab, embedding a text shows the vector's dimension, its first values and the time, and
    #curl/#python show that request to /v1/embeddings; the same text gives the same values again."""
    page = chrome.page(base_url=cluster.url)
    _embeddings_tab(page, cluster)
    expect(page.locator("#embed-model option")).to_have_text([MODEL])
    _embed(page, "GPUs are fast.")
    expect(page.locator("#embed-error")).to_be_hidden()
    stats = page.locator("#embed-stats").inner_text()
    assert re.search(rf"dimension {sim_engine.EMBEDDING_DIM} · \d+ ms", stats), stats
    values = page.locator("#embed-values").inner_text()
    shown = re.findall(r"-?\d\.\d{6}", values)
    assert len(shown) == 8 and f"{sim_engine.EMBEDDING_DIM - 8} more" in values, values
    expected = sim_engine.embedding("GPUs are fast.")[:8]
    assert [float(v) for v in shown] == pytest.approx(expected, abs=2e-6)
    curl = page.locator("#curl").inner_text()
    assert f"{cluster.url}/v1/embeddings" in curl and f'"model":"{MODEL}"' in curl and "GPUs are fast." in curl, curl
    python = page.locator("#python").inner_text()
    assert "client.embeddings.create(" in python and f'model="{MODEL}"' in python, python
    chrome.screenshot(page, "embeddings")
    _embed(page, "GPUs are fast.")
    assert page.locator("#embed-values").inner_text() == values


def test_an_embeddings_refusal_is_shown_in_words_on_a_phone(cluster: system.System, chrome: browser.Browser) -> None:
    """A model the router does not serve is refused in the API's words in #embed-error (no bare status code), no
    vector is shown, and the tab fits a 390 px screen."""
    page = chrome.page(base_url=cluster.url, viewport=browser.PHONE)
    _embeddings_tab(page, cluster)
    page.evaluate("document.querySelector('#embed-model option').value = 'no-such-model'")
    _embed(page, "hello")
    error = page.locator("#embed-error")
    expect(error).to_be_visible()
    words = error.inner_text()
    assert "no-such-model" in words and len(words.split()) >= 4, words
    assert not re.search(r"\b(404|400)\b", words), words
    expect(page.locator("#embed-values")).to_be_empty()
    assert page.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width
    chrome.screenshot(page, "refused")
