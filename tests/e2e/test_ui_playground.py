"""The Playground in a real browser: Debian's Chromium (llmgw/testing/browser.py) against a real ``llmgw server``,
a real agent (node1) and a sim engine paced at 20 tokens a second, so a reply arrives over about two seconds.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``) at 1280 px and
at a phone's 390 px.
"""

from __future__ import annotations

import re

import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, system

pytestmark = pytest.mark.slow

# Waits, not timings: a sim replica is Ready within a few seconds here; the margin is for a loaded CI machine.
LIVE_S = 45.0
MODEL = "chat"
WARMING = "warming"
#: 40 tokens at 20 tokens/s: the reply takes about two seconds, long enough to watch it grow.
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    """The module's system with a paced chat model Ready and one that never finishes starting."""
    ui_system.apply(system.sim_model(MODEL, args=["--decode-tps", "20"]))
    ui_system.wait_model(MODEL, timeout=LIVE_S)
    ui_system.wait_router(MODEL, 1, timeout=LIVE_S)
    # A model still starting (its engine waits 10 minutes before it listens): never offered in the list.
    ui_system.apply(system.sim_model(WARMING, args=["--startup-delay", "600"]))
    return ui_system


def _open_playground(page: sync_api.Page, cluster: system.System) -> None:
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.get_by_role("link", name="Playground").click()
    page.wait_for_url("**/ui/playground")
    expect(page).to_have_title("llmgw · Playground")


def _send_and_watch(page: sync_api.Page) -> list[int]:
    """Send the form and sample ``#reply``'s length until the page says the stream ended; the samples."""
    page.locator("#max-tokens").fill(str(MAX_TOKENS))
    page.locator("#system").fill("You are terse.")
    page.locator("#message").fill("Say something about GPUs.")
    page.locator("#send").click()
    samples: list[int] = []
    for _ in range(int(LIVE_S / 0.05)):
        length, done = page.evaluate("[document.getElementById('reply').textContent.length,"
                                     " document.getElementById('chat-form').dataset.done || '']")
        if done:
            break
        samples.append(length)
        page.wait_for_timeout(50)
    else:
        pytest.fail(f"the stream did not end within {LIVE_S} s; #reply lengths seen: {samples[-10:]}")
    return samples


def test_playground_streams_a_reply_with_ttft_and_the_equivalent_curl(
        cluster: system.System, chrome: browser.Browser) -> None:
    """Admin picks the Ready sim model, sends a message: #reply grows in several steps while streaming and ends
    non-empty, #stats shows TTFT in ms and tokens/s, and #curl/#python show that same request."""
    page = chrome.page(base_url=cluster.url)
    _open_playground(page, cluster)
    assert cluster.model_status(WARMING).get("state") != "Ready"
    expect(page.locator("#model option")).to_have_text([MODEL])
    chrome.screenshot(page, "playground")

    samples = _send_and_watch(page)
    growing = sorted({n for n in samples if n > 0})
    assert len(growing) >= 2, f"#reply should grow token by token while streaming, saw lengths {samples}"
    reply = page.locator("#reply").inner_text()
    assert reply.strip(), "the reply ended empty"
    assert len(reply) >= growing[-1]
    expect(page.locator("#reply-error")).to_be_hidden()
    stats = page.locator("#stats").inner_text()
    assert re.search(r"TTFT \d+ ms", stats), stats
    assert re.search(r"[\d.]+ tokens/s", stats), stats
    curl = page.locator("#curl").inner_text()
    assert f'"model":"{MODEL}"' in curl and f"{cluster.url}/v1/chat/completions" in curl, curl
    assert '"max_tokens":40' in curl and "You are terse." in curl, curl
    assert "Authorization" not in curl, "no key was given, so the snippet must not ask for one"
    python = page.locator("#python").inner_text()
    assert f'model="{MODEL}"' in python and "base_url=" in python and "stream=True" in python, python
    chrome.screenshot(page, "streamed")


def test_playground_fits_a_phone_and_a_pasted_key_never_reaches_the_snippets(
        cluster: system.System, chrome: browser.Browser) -> None:
    """At 390 px the playground streams a reply with no sideways scroll; an API key typed in goes only to the
    request: the snippets name $LLMGW_API_KEY, never the key, and the key field starts empty."""
    page = chrome.page(base_url=cluster.url, viewport=browser.PHONE)
    _open_playground(page, cluster)
    expect(page.locator("#api-key")).to_have_value("")
    secret = "sk-not-a-real-key-0123456789"
    # No key exists in the cluster, so the OpenAI API ignores the header; what matters here is where it shows.
    page.locator("#api-key").fill(secret)
    _send_and_watch(page)
    expect(page.locator("#reply")).not_to_be_empty()
    expect(page.locator("#stats")).to_contain_text("TTFT")
    assert secret not in page.locator("#curl").inner_text() + page.locator("#python").inner_text()
    expect(page.locator("#curl")).to_contain_text("$LLMGW_API_KEY")
    assert page.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width
    chrome.screenshot(page, "streamed")


def test_playground_compares_two_replies_side_by_side_and_shows_a_refusal_in_words(
        cluster: system.System, chrome: browser.Browser) -> None:
    """Compare streams a second reply into its own pane with its own stats; a model the router does not serve
    is refused in the API's words in #reply-error (no bare status code) while the other pane still answers."""
    page = chrome.page(base_url=cluster.url)
    _open_playground(page, cluster)
    # The list offers Ready models only; a name that is not (any more) served is what a stale page would send.
    page.evaluate("document.querySelector('#model option').value = 'no-such-model'")
    page.locator("#compare").select_option(MODEL)
    _send_and_watch(page)
    expect(page.locator("#compare-pane")).to_be_visible()
    expect(page.locator("#reply-b")).not_to_be_empty()
    expect(page.locator("#stats-b")).to_contain_text("TTFT")
    error = page.locator("#reply-error")
    expect(error).to_be_visible()
    words = error.inner_text()
    assert "no-such-model" in words and len(words.split()) >= 4, words
    assert not re.search(r"\b(404|400)\b", words), words
    expect(page.locator("#reply")).to_be_empty()
    chrome.screenshot(page, "compare")
