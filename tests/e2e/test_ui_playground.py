"""The Playground's chat in a real browser: Debian's Chromium (llmgw/testing/browser.py) against a real
``llmgw server``, a real agent (node1) and sim engines: ``echo`` answers each chat with its last user message
(``--echo``), ``chat`` with `` tok0 tok1 …`` at 20 tokens a second, slow enough to stop mid-answer.

What the engines received is read from the sims themselves (``/sim/stats`` lists the request bodies,
``/metrics`` counts the requests whose client went away), so "each request carries the whole conversation"
and "Stop cancels at the engine" are asserted where they happen, not on the page's word.

Screenshots go to the test artifact folder (``$LLMGW_TEST_ARTIFACTS`` or ``test-artifacts/ui/``) at 1280 px and
at a phone's 390 px.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from playwright import sync_api
from playwright.sync_api import expect

from llmgw.testing import browser, system
from llmgw.testing.procs import wait_for

pytestmark = pytest.mark.slow

# Waits, not timings: a sim replica is Ready within a few seconds here; the margin is for a loaded CI machine.
LIVE_S = 45.0
ECHO = "echo"
CHAT = "chat"
WARMING = "warming"
SYSTEM = "You are terse."
HOSTILE = ("<img src=x onerror=\"window.__pwned=1\"> and <script>window.__pwned=2</script>\n\n"
           "[click me](javascript:window.__pwned=3) [data](data:text/html,<b>x</b>) "
           "[docs](https://example.com/docs) **bold** and `inline <b>code</b>`\n\n"
           "- first <iframe src=x></iframe>\n- second\n\n"
           "```python\nprint(\"<script>alert(1)</script>\")\n```")

#: What the renderer builds (serialised) for the rest of the Markdown it knows.
RENDERED = {
    "# Title\nSome *it* and __b__ and snake_case_name and 2 * 3 * 4":
        '<h3 class="md-h">Title</h3><p>Some <em>it</em> and <strong>b</strong> and snake_case_name and 2 * 3 * 4</p>',
    "1. one\n2. two\n   more\n\n3) three":
        '<ol><li>one</li><li>two<br>more</li></ol><ol start="3"><li>three</li></ol>',
    "> quoted **b**\n> line two\n\n---\ntext":
        "<blockquote><p>quoted <strong>b</strong><br>line two</p></blockquote><hr><p>text</p>",
    "**bold *nested* x** [u](http://x.y) [y](//evil.com) <b>raw</b>":
        '<p><strong>bold <em>nested</em> x</strong> <a href="http://x.y/" rel="noopener noreferrer nofollow"'
        ' target="_blank">u</a> [y](//evil.com) &lt;b&gt;raw&lt;/b&gt;</p>',
}


@pytest.fixture(scope="module")
def cluster(ui_system: system.System) -> system.System:
    """The module's system with the echo and the paced chat model Ready, and one that never finishes starting."""
    ui_system.apply(system.sim_model(ECHO, args=["--echo", "--decode-tps", "50"]))
    ui_system.apply(system.sim_model(CHAT, args=["--decode-tps", "20"]))
    for name in (ECHO, CHAT):
        ui_system.wait_model(name, timeout=LIVE_S)
        ui_system.wait_router(name, 1, timeout=LIVE_S)
    # A model still starting (its engine waits 10 minutes before it listens): never offered in the list.
    ui_system.apply(system.sim_model(WARMING, args=["--startup-delay", "600"]))
    return ui_system


def _engine(cluster: system.System, model: str) -> str:
    (replica,) = cluster.replicas(model)
    return str(replica["endpoint"])


def _bodies(cluster: system.System, model: str) -> list[dict[str, Any]]:
    """The chat request bodies the model's engine received, oldest first (the router's probes left out)."""
    seen = httpx.get(_engine(cluster, model) + "/sim/stats", timeout=5, trust_env=False).json()["requests"]
    return [b for b in seen if b.get("stream") and b.get("stream_options")]


def _aborted(cluster: system.System, model: str) -> int:
    text = httpx.get(_engine(cluster, model) + "/metrics", timeout=5, trust_env=False).text
    (value,) = re.findall(r"^llmgw_sim_requests_aborted_total (\d+)$", text, re.M)
    return int(value)


def _open_playground(page: sync_api.Page, cluster: system.System) -> None:
    browser.log_in(page, username="admin", password=cluster.admin_password)
    page.get_by_role("link", name="Playground").click()
    page.wait_for_url("**/ui/playground")
    expect(page).to_have_title("llmgw · Playground")


def _send(page: sync_api.Page, text: str, *, wait: bool = True) -> None:
    """Type ``text`` and send it; with ``wait``, until the page says every answer's stream ended."""
    done = int(page.evaluate("document.getElementById('chat-form').dataset.done || '0'"))
    page.locator("#message").fill(text)
    page.locator("#send").click()
    if wait:
        # A function, not an expression: Playwright evals an expression, which the page's CSP refuses.
        page.wait_for_function("(n) => Number(document.getElementById('chat-form').dataset.done || 0) > n",
                               arg=done, timeout=LIVE_S * 1000)


def _answers(page: sync_api.Page, side: str) -> sync_api.Locator:
    return page.locator(f"#conv-{side} .msg.assistant")


def _snippet_body(curl: str) -> dict[str, Any]:
    """The JSON body of the curl snippet (its ``-d '…'``, shell-quoted)."""
    quoted = curl.rsplit("-d '", 1)[1].rstrip().removesuffix("'")
    return dict(json.loads(quoted.replace("'\\''", "'")))


def test_three_turns_each_carry_the_whole_conversation_and_the_snippets_are_that_request(
        cluster: system.System, chrome: browser.Browser) -> None:
    """Three turns with a system prompt and every parameter set: the page shows the history (three questions,
    three answers, each with TTFT and tokens/s); the engine received, on the third request, the system prompt,
    both earlier turns with their answers and the new question, and the parameters as set; the curl and Python
    snippets are that body; the conversation survives a reload (session storage, never the key) until Clear."""
    page = chrome.page(base_url=cluster.url)
    _open_playground(page, cluster)
    assert cluster.model_status(WARMING).get("state") != "Ready"
    expect(page.locator("#model option")).to_have_text([CHAT, ECHO])
    page.locator("#model").select_option(ECHO)
    secret = "sk-not-a-real-key-0123456789"
    # No key exists in the cluster, so the OpenAI API ignores the header; what matters is where it shows.
    page.locator("#api-key").fill(secret)
    page.locator("#system").fill(SYSTEM)
    page.locator("#temperature").fill("0.3")
    page.locator("#top-p").fill("0.9")
    page.locator("#max-tokens").fill("64")
    page.locator("#seed").fill("42")
    page.locator("#stop-seqs").fill("END\nSTOP HERE")
    page.locator("#json-mode").check()
    questions = ["What is a GPU?", "And a TPU, in 'short'?", "Which is faster for **inference**?"]
    for q in questions:
        _send(page, q)
    expect(page.locator("#conv-a .msg.user")).to_have_text(questions)
    expect(_answers(page, "a")).to_have_count(3)
    assert _answers(page, "a").nth(1).locator(".content").inner_text() == questions[1]
    expect(_answers(page, "a").nth(2).locator(".content strong")).to_have_text("inference")
    for i in range(3):
        assert re.search(r"TTFT \d+ ms · \d+ tokens · [\d.]+ tokens/s", _answers(page, "a").nth(i).inner_text())
    chrome.screenshot(page, "three-turns")

    third = _bodies(cluster, ECHO)[-1]
    assert third["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": questions[0]}, {"role": "assistant", "content": questions[0]},
        {"role": "user", "content": questions[1]}, {"role": "assistant", "content": questions[1]},
        {"role": "user", "content": questions[2]}]
    assert (third["temperature"], third["top_p"], third["max_tokens"], third["seed"]) == (0.3, 0.9, 64, 42)
    assert third["stop"] == ["END", "STOP HERE"] and third["response_format"] == {"type": "json_object"}

    curl = page.locator("#curl").inner_text()
    assert f"{cluster.url}/v1/chat/completions" in curl and "$LLMGW_API_KEY" in curl, curl
    sent = _snippet_body(curl)
    assert sent == {k: third[k] for k in sent}, "the curl snippet is not the body the engine received"
    python = page.locator("#python").inner_text()
    for part in ("seed=42", "top_p=0.9", "temperature=0.3", "max_tokens=64", '"type": "json_object"',
                 '"END",', "stream=True", f'model="{ECHO}"', "os.environ[\"LLMGW_API_KEY\"]"):
        assert part in python, (part, python)
    assert secret not in curl + python
    # The Python snippet is a program: run by the real openai client it sends the same body and prints the answer.
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()} | {"LLMGW_API_KEY": "unused"}
    ran = subprocess.run([sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=LIVE_S,
                         check=False)
    assert ran.returncode == 0 and ran.stdout == questions[2], ran.stderr
    again = _bodies(cluster, ECHO)[-1]
    assert again == third, "the Python snippet sent another body than the page did"
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=cluster.url)
    page.locator("#copy-curl").click()
    expect(page.locator("#copy-status")).to_have_text("Copied (curl).")
    assert page.evaluate("() => navigator.clipboard.readText()") == curl
    page.locator("#copy-python").click()
    expect(page.locator("#copy-status")).to_have_text("Copied (Python).")
    assert page.evaluate("() => navigator.clipboard.readText()") == python

    page.reload()
    expect(page.locator("#conv-a .msg.user")).to_have_text(questions)
    expect(page.locator("#seed")).to_have_value("42")
    expect(page.locator("#api-key")).to_have_value("")
    stored = page.evaluate("JSON.stringify(Object.assign({}, sessionStorage, localStorage))")
    assert questions[2] in stored and secret not in stored
    page.locator("#clear").click()
    expect(page.locator("#conv-a .msg")).to_have_count(0)
    assert questions[0] not in page.evaluate("JSON.stringify(Object.assign({}, sessionStorage, localStorage))")


def test_stop_mid_stream_cancels_at_the_engine(cluster: system.System, chrome: browser.Browser) -> None:
    """Stop during a 2000-token answer: the answer stops growing and says Stopped, Send comes back, and the
    engine counts the request as aborted (the router cancelled upstream when the browser's fetch was aborted)."""
    page = chrome.page(base_url=cluster.url)
    _open_playground(page, cluster)
    page.locator("#model").select_option(CHAT)
    page.locator("#max-tokens").fill("2000")
    before = _aborted(cluster, CHAT)
    _send(page, "Tell me everything about GPUs.", wait=False)
    content = _answers(page, "a").last.locator(".content")
    page.wait_for_function("() => document.querySelector('#conv-a .msg.assistant:last-child .content')"
                           ".textContent.length > 30", timeout=LIVE_S * 1000)
    expect(page.locator("#stop")).to_be_enabled()
    clicked = time.monotonic()
    page.locator("#stop").click()
    expect(_answers(page, "a").last.locator(".stats")).to_contain_text("Stopped", timeout=LIVE_S * 1000)
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    stopped_at = len(content.inner_text())
    wait_for(lambda: _aborted(cluster, CHAT) > before, timeout=LIVE_S, what="the engine's aborted count to rise")
    # Reported, not asserted: the engine's abort time and this one share CLOCK_MONOTONIC (one machine).
    at = httpx.get(_engine(cluster, CHAT) + "/sim/stats", timeout=5, trust_env=False).json()["aborts"][-1]["at"]
    print(f"Stop click to the engine's abort: {1000 * (at - clicked):.0f} ms")
    # 20 tokens a second: a stream still running would add about ten in this half second.
    page.wait_for_timeout(500)
    assert len(content.inner_text()) == stopped_at, "the answer kept growing after Stop"
    assert stopped_at < len("".join(f" tok{i}" for i in range(2000)))
    chrome.screenshot(page, "stopped")


def test_compare_two_models_each_with_its_own_history(cluster: system.System, chrome: browser.Browser) -> None:
    """With Compare, both models answer the same two questions side by side, each pane with its stats, and each
    engine receives its own answers as the assistant turns; the snippets can show either request; an emptied
    parameter is left out of the request."""
    page = chrome.page(base_url=cluster.url)
    _open_playground(page, cluster)
    page.locator("#model").select_option(ECHO)
    page.locator("#compare").select_option(CHAT)
    page.locator("#max-tokens").fill("5")
    page.locator("#temperature").fill("")  # an emptied field is not sent: the engine's default applies
    _send(page, "first question")
    _send(page, "second question")
    expect(page.locator("#compare-pane")).to_be_visible()
    expect(_answers(page, "a").locator(".content")).to_have_text(["first question", "second question"])
    expect(_answers(page, "b").locator(".content")).to_have_text([" tok0 tok1 tok2 tok3 tok4"] * 2)
    for side in ("a", "b"):
        expect(_answers(page, side).last.locator(".stats")).to_contain_text("tokens/s")
    toks = " tok0 tok1 tok2 tok3 tok4"
    assert _bodies(cluster, CHAT)[-1]["messages"] == [
        {"role": "user", "content": "first question"}, {"role": "assistant", "content": toks},
        {"role": "user", "content": "second question"}]
    assert "temperature" not in _bodies(cluster, CHAT)[-1]
    assert _bodies(cluster, ECHO)[-1]["messages"] == [
        {"role": "user", "content": "first question"}, {"role": "assistant", "content": "first question"},
        {"role": "user", "content": "second question"}]
    expect(page.locator("#snippet-for option")).to_have_text([ECHO, CHAT])
    page.locator("#snippet-for").select_option(CHAT)
    assert _snippet_body(page.locator("#curl").inner_text())["messages"][1]["content"] == toks
    chrome.screenshot(page, "compare")


def test_hostile_markdown_is_inert_and_a_refusal_is_in_words(cluster: system.System, chrome: browser.Browser) -> None:
    """An answer full of HTML and script links renders as text: no img, script or iframe element, no
    javascript: or data: link, nothing run; the Markdown around it (bold, code, a list, a fenced block with its
    Copy button, an https link with rel=noopener) is rendered. On a phone, with no sideways scroll. A model the
    router does not serve is refused in the API's words, not a bare status code."""
    page = chrome.page(base_url=cluster.url, viewport=browser.PHONE)
    _open_playground(page, cluster)
    page.locator("#model").select_option(ECHO)
    page.locator("#max-tokens").fill("200")
    _send(page, HOSTILE)
    answer = _answers(page, "a").last.locator(".content")
    assert "<img src=x onerror=" in answer.inner_text() and "<script>window.__pwned=2</script>" in answer.inner_text()
    conv = page.locator("#pane-a")
    for selector in ("img", "script", "iframe", "a[href^='javascript']", "a[href^='data']", "[onerror]"):
        expect(conv.locator(selector)).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    link = answer.locator("a")
    expect(link).to_have_count(1)
    expect(link).to_have_attribute("href", "https://example.com/docs")
    assert "noopener" in (link.get_attribute("rel") or "")
    expect(answer.locator("strong")).to_have_text(["bold"])
    expect(answer.locator("p code")).to_have_text(["inline <b>code</b>"])
    expect(answer.locator("li")).to_have_count(2)
    expect(answer.locator(".md-code pre code")).to_have_text('print("<script>alert(1)</script>")')
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=cluster.url)
    answer.locator(".md-code .md-copy").click()
    expect(answer.locator(".md-code .md-copy")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == 'print("<script>alert(1)</script>")'
    # The renderer alone, on what a stream mid-answer or a sly model could send.
    kinds = page.evaluate("""() => {
        const box = document.createElement('div');
        box.appendChild(window.llmgwMarkdown.render('[x](JaVaScRiPt:alert(1)) [y]( javascript:alert(1) ) ' +
            '<a href="javascript:alert(1)">z</a> ```\\n<svg onload=alert(1)>'));
        return Array.from(box.querySelectorAll('*')).map((e) => e.tagName.toLowerCase());
    }""")
    assert not set(kinds) & {"a", "svg", "img", "script"}, kinds
    for text, html in RENDERED.items():
        got = page.evaluate("(t) => { const d = document.createElement('div');"
                            " d.appendChild(window.llmgwMarkdown.render(t)); return d.innerHTML; }", text)
        assert got == html, (text, got)
    assert page.evaluate("document.documentElement.scrollWidth") <= browser.PHONE.width
    chrome.screenshot(page, "hostile-markdown")

    # The list offers Ready models only; a name that is not (any more) served is what a stale page would send.
    page.evaluate("document.querySelector('#model option').value = 'no-such-model'")
    page.locator("#model").select_option("no-such-model")
    _send(page, "hello?")
    error = _answers(page, "a").last.locator(".error")
    expect(error).to_be_visible()
    words = error.inner_text()
    assert "no-such-model" in words and len(words.split()) >= 4, words
    assert not re.search(r"\b(404|400)\b", words), words
