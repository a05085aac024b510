"""The Keys page against a real server, agent and sim engine: create (secret once), use, disable, enable, delete,
last used, viewer.

Driven with httpx as in test_ui_pages.py: the session cookie is ``Secure``, which a cookie jar never
sends over plain http, so each request carries it in its ``Cookie`` header as a browser on loopback would.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model
from llmgw.testing.uiclient import Browser, Node, page

MODEL = "sim-keys"


def key_rows(doc: Node) -> dict[str, Node]:
    return {n.attrs["data-key"]: n for n in doc.find_all(lambda n: n.tag == "tr" and "data-key" in n.attrs)}


def mutating(doc: Node) -> list[Node]:
    return doc.find_all(lambda n: "data-mutating" in n.attrs)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent and Ready sim model, and one standing key: with none, the OpenAI API takes no key."""
    with system_mod.running(tmp_path_factory.mktemp("ui-keys")) as s:
        s.apply(sim_model(MODEL))
        s.wait_model(MODEL)
        made = s.request("POST", "/api/v1/keys", json={"name": "standing"})
        assert made.status_code == 201, made.text
        yield s


def chat(system: System, secret: str) -> str:
    client = openai.OpenAI(base_url=system.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    try:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return out.choices[0].message.content or ""
    finally:
        client.close()


def test_key_created_used_and_deleted_through_the_page(system: System, browser: Browser) -> None:
    """A key made on the page shows its secret once, opens /v1 to the openai client, and once deleted there, 401s."""
    browser.log_in("admin", system.admin_password)
    made = browser.request("POST", "/ui/keys", data={"name": "from-ui", "models": f" {MODEL} , ", "rpm": "60",
                                                     "tpm": ""})
    assert made.status_code == 201, made.text
    doc = page(made)
    secret_el = doc.by_id("new-key-secret")
    new_key = doc.by_id("new-key")
    assert new_key is not None and secret_el is not None and new_key.by_id("copy-key") is not None
    secret = secret_el.text
    assert secret.startswith("llmgw-")
    listed = system.get("/api/v1/keys")["items"]
    (key,) = [k for k in listed if k["name"] == "from-ui"]
    assert key["models"] == [MODEL] and key["rpm"] == 60 and key["tpm"] == 0
    row = key_rows(doc)[key["id"]]
    assert MODEL in row.text and "60" in row.text
    again = browser.request("GET", "/ui/keys")
    assert again.status_code == 200 and secret not in again.text and page(again).by_id("new-key") is None
    assert key["id"] in key_rows(page(again))
    # The router learns of the key with its next table from the control plane.
    wait_for(lambda: _answers(system, secret), timeout=10, interval=0.2, what="the new key is accepted")

    gone = browser.request("POST", f"/ui/keys/{key['id']}/delete")
    assert gone.status_code == 303 and gone.headers["location"] == "/ui/keys"
    assert key["id"] not in key_rows(page(browser.request("GET", "/ui/keys")))
    wait_for(lambda: _refused(system, secret), timeout=10, interval=0.2, what="the deleted key is refused")


def _answers(system: System, secret: str) -> bool:
    try:
        chat(system, secret)
    except openai.AuthenticationError:
        return False
    return True


def _refused(system: System, secret: str) -> bool:
    try:
        chat(system, secret)
    except openai.AuthenticationError:
        return True
    return False


def test_refusal_is_shown_in_words(system: System, browser: Browser) -> None:
    """Deleting a key that does not exist shows the API's own message on the page, not a status code."""
    browser.log_in("admin", system.admin_password)
    resp = browser.request("POST", "/ui/keys/key-nope/delete")
    error = page(resp).by_id("keys-error")
    assert resp.status_code == 404 and error is not None and "'key-nope' does not exist" in error.text


def test_viewer_sees_keys_without_controls_and_is_refused(system: System, browser: Browser) -> None:
    """A viewer sees the keys it may (issue 26: a project viewer its own) with no [data-mutating] control; a create or
    disable it posts anyway gets the 403 sentence and changes nothing."""
    made = system.request("POST", "/api/v1/users", json={"name": "vik", "role": "viewer"})
    assert made.status_code == 201, made.text
    assert system.request("PUT", "/api/v1/projects/default/members", json={"user": "vik", "role": "viewer"}
                          ).status_code == 200
    theirs = system.request("POST", "/api/v1/keys", json={"name": "viks", "user": "vik"})
    assert theirs.status_code == 201, theirs.text
    browser.log_in("vik", made.json()["password"])
    resp = browser.request("GET", "/ui/keys")
    doc = page(resp)
    assert resp.status_code == 200 and "llmgw · Keys" in resp.text
    rows = key_rows(doc)
    assert theirs.json()["id"] in rows and not any("standing" in r.text for r in rows.values())  # not theirs
    assert not mutating(doc)
    before = len(system.get("/api/v1/keys")["items"])
    refused = browser.request("POST", "/ui/keys", data={"name": "sneaky", "models": "", "rpm": "0", "tpm": "0"})
    error = page(refused).by_id("keys-error")
    assert refused.status_code == 403 and error is not None
    assert "user vik is a viewer of project 'default'" in error.text and "llmgw project add-member" in error.text
    assert len(system.get("/api/v1/keys")["items"]) == before
    switched = browser.request("POST", f"/ui/keys/{theirs.json()['id']}/disable")
    error = page(switched).by_id("keys-error")
    assert switched.status_code == 403 and error is not None and "user vik is a viewer" in error.text
    assert next(k for k in system.get("/api/v1/keys")["items"] if k["id"] == theirs.json()["id"])["disabled"] is False


def test_key_disabled_and_enabled_through_the_page_with_its_last_use(system: System, browser: Browser) -> None:
    """Disable and enable post to the API and come back to the list, which shows the state, the one button that
    applies and "last used" (never, then seconds ago); an unknown key's refusal is the API's sentence."""
    browser.log_in("admin", system.admin_password)
    made = browser.request("POST", "/ui/keys", data={"name": "switch", "models": "", "rpm": "", "tpm": "",
                                                     "priority": "7"})
    assert made.status_code == 201, made.text
    secret = page(made).by_id("new-key-secret").text  # type: ignore[union-attr]
    (key,) = [k for k in system.get("/api/v1/keys")["items"] if k["name"] == "switch"]
    assert key["priority"] == 7
    row = key_rows(page(browser.request("GET", "/ui/keys")))[key["id"]]
    assert row.find(lambda n: "last-used" in n.attrs.get("class", "")).text == "never"  # type: ignore[union-attr]
    wait_for(lambda: _answers(system, secret), timeout=10, interval=0.2, what="the new key is accepted")

    def last_used() -> str | None:
        row = key_rows(page(browser.request("GET", "/ui/keys")))[key["id"]]
        text = row.find(lambda n: "last-used" in n.attrs.get("class", "")).text  # type: ignore[union-attr]
        return text if text.endswith("s ago") else None

    wait_for(last_used, timeout=10, interval=0.3, what="the key's last use on the page")

    off = browser.request("POST", f"/ui/keys/{key['id']}/disable")
    assert off.status_code == 303 and off.headers["location"] == "/ui/keys"
    row = key_rows(page(browser.request("GET", "/ui/keys")))[key["id"]]
    buttons = [b.text for b in row.find_all(lambda n: n.tag == "button")]
    assert "data-disabled" in row.attrs and "disabled" in row.text and buttons == ["Enable", "Delete"]
    wait_for(lambda: _refused(system, secret), timeout=10, interval=0.2, what="the disabled key is refused")

    on = browser.request("POST", f"/ui/keys/{key['id']}/enable")
    assert on.status_code == 303
    row = key_rows(page(browser.request("GET", "/ui/keys")))[key["id"]]
    assert [b.text for b in row.find_all(lambda n: n.tag == "button")] == ["Disable", "Delete"]
    wait_for(lambda: _answers(system, secret), timeout=10, interval=0.2, what="the enabled key is accepted")

    missing = browser.request("POST", "/ui/keys/key-nope/disable")
    error = page(missing).by_id("keys-error")
    assert missing.status_code == 404 and error is not None and "'key-nope' does not exist" in error.text
    bad = browser.request("POST", "/ui/keys", data={"name": "p", "priority": "high"})
    error = page(bad).by_id("keys-error")
    assert bad.status_code == 422 and error is not None and "priority must be a whole number" in error.text
