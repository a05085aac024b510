"""The UI's model page against a real server, agent and sim engine: spec, replicas, events, scale, delete.

Driven with ``llmgw.testing.uiclient`` (httpx as a browser, the page parsed into a tree), as test_ui_pages is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from llmgw.testing import system as system_mod
from llmgw.testing.flakyhttp import FlakyHttp
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model
from llmgw.testing.tiny_gguf import write_tiny_llama_gguf
from llmgw.testing.uiclient import Browser, Node, logged_in, page

MODEL = "sim-mp"
MIB = 2**20


def phases(doc: Node) -> dict[str, str]:
    """Each replica row's (``tr[data-replica]``) phase cell, by replica id."""
    rows = doc.find_all(lambda n: n.tag == "tr" and "data-replica" in n.attrs)
    return {tr.attrs["data-replica"]: "".join(c.text for c in tr.find_all(lambda n: n.tag == "td" and "phase" in
                                                                       n.attrs.get("class", "").split()))
            for tr in rows}


def words(doc: Node, id_: str) -> str:
    found = doc.by_id(id_)
    return found.text if found is not None else ""


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, agent and Ready sim model for the module (a server start is seconds)."""
    # The fetch test's server is on loopback, standing for another host: the agent may fetch from it.
    with system_mod.running(tmp_path_factory.mktemp("uimodel"),
                            agent_env={"LLMGW_AGENT_FETCH_ALLOW_PRIVATE": "true"}) as s:
        s.apply(sim_model(MODEL))
        s.wait_model(MODEL)
        yield s


@pytest.fixture
def viewer(system: System, request: pytest.FixtureRequest) -> Iterator[Browser]:
    # One system serves the module, so each test's viewer is a user of its own (a second "vic" is a 409).
    name = "vic-" + request.node.name.removeprefix("test_")[:20].replace("_", "-")
    made = system.request("POST", "/api/v1/users", json={"name": name, "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    b = logged_in(system.url, made.json()["name"], made.json()["password"])
    try:
        yield b
    finally:
        b.close()


def test_page_shows_spec_replicas_and_events(admin: Browser) -> None:
    """The model page shows the spec as YAML, the replica Ready on node1 and the model's Created event; the
    live fragment carries the same, and the overview links the model's name to its page."""
    resp = admin.request("GET", f"/ui/models/{MODEL}")
    assert resp.status_code == 200, resp.text
    assert f"<title>llmgw · Model {MODEL}</title>" in resp.text
    p = page(resp)
    assert "engine: sim" in p.get("spec").raw and "replicas: 1" in p.get("spec").raw, p.get("spec").raw
    assert list(phases(p).values()) == ["Ready"], phases(p)
    assert "node1" in p.get("replicas").raw
    assert "Created" in p.get("model-events").raw
    assert p.mutating() == 5  # the − form, the + form, the edit <details> and its Apply button, the delete <details>
    assert "name: sim-mp" in p.get("spec-editor").raw and "engine: sim" in p.get("spec-editor").raw
    live = page(admin.request("GET", f"/ui/models/{MODEL}/live"))
    assert list(phases(live).values()) == ["Ready"] and "engine: sim" in live.get("spec").raw
    assert f"/ui/models/{MODEL}" in page(admin.request("GET", "/ui/")).links()


def test_admin_scales_up_and_down(system: System, admin: Browser) -> None:
    """+ applies the spec with one replica more (the REST API then says 2), − brings it back to 1."""
    resp = admin.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "1"})
    assert resp.status_code == 303 and resp.headers["location"] == f"/ui/models/{MODEL}", resp.text
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 2
    assert "replicas: 2" in page(admin.request("GET", f"/ui/models/{MODEL}")).get("spec").raw
    resp = admin.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "-1"})
    assert resp.status_code == 303, resp.text
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 1


def test_viewer_sees_no_control_and_gets_the_403_in_words(system: System, viewer: Browser) -> None:
    """A viewer's page has no [data-mutating]; a scale POST anyway shows the API's 403 message, and nothing changes."""
    resp = viewer.request("GET", f"/ui/models/{MODEL}")
    assert resp.status_code == 200 and page(resp).mutating() == 0
    assert "engine: sim" in page(resp).get("spec").raw
    # The call the page's + makes (the scale endpoint), so the sentence shown must be this one's.
    api = viewer.client.post(f"/api/v1/models/{MODEL}/scale", json={"replicas": 2}, headers=viewer.cookie_header())
    assert api.status_code == 403, api.text
    resp = viewer.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "1"})
    assert resp.status_code == 403
    shown = " ".join(page(resp).get("model-error").raw.split())
    assert shown == " ".join(api.json()["error"]["message"].split()) and shown
    resp = viewer.request("POST", f"/ui/models/{MODEL}/delete")
    assert resp.status_code == 403 and page(resp).get("model-error").raw.strip()
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 1


def test_delete_removes_the_model(system: System, admin: Browser) -> None:
    """Delete (the confirm form's POST) removes the model and goes to the overview; its page then says why not."""
    system.apply(sim_model("sim-gone", replicas=0))
    resp = admin.request("POST", "/ui/models/sim-gone/delete")
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/", resp.text
    assert system.request("GET", "/api/v1/models/sim-gone").status_code == 404
    resp = admin.request("GET", "/ui/models/sim-gone")
    assert resp.status_code == 404 and "does not exist" in resp.text


def test_models_list_links_each_model_and_offers_apply_to_an_operator(admin: Browser, viewer: Browser) -> None:
    """/ui/models lists the model linked to its page with an "Apply a model" link; a viewer's list has no link to
    the editor (no [data-mutating]), and a viewer who posts to it anyway sees the API's 403 sentence."""
    p = page(admin.request("GET", "/ui/models"))
    assert f"/ui/models/{MODEL}" in p.links() and "/ui/apply" in p.links() and p.mutating() == 1
    v = page(viewer.request("GET", "/ui/models"))
    assert f"/ui/models/{MODEL}" in v.links() and "/ui/apply" not in v.links() and v.mutating() == 0
    posted = viewer.request("POST", "/ui/apply", data={"op": "apply", "spec": yaml.safe_dump(sim_model("sim-vic"))})
    assert posted.status_code == 403 and len(words(page(posted), "editor-error").split()) >= 3
    assert "403" not in words(page(posted), "editor-error") and page(posted).mutating() == 0


def test_bad_yaml_and_an_invalid_field_are_shown_in_words_keeping_the_text(system: System, admin: Browser) -> None:
    """YAML that does not parse and a manifest the API refuses each re-render the editor with #editor-error in
    words (the API's own message for the invalid field) and the user's text still in #spec-editor."""
    bad = "apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: broken\n"
    resp = admin.request("POST", "/ui/apply", data={"spec": bad, "op": "apply"})
    assert resp.status_code == 400
    p = page(resp)
    assert "not valid YAML" in words(p, "editor-error") and "line" in words(p, "editor-error")
    assert p.get("spec-editor").raw == bad

    invalid = yaml.safe_dump(sim_model("sim-bad", replicas="many"), sort_keys=False)
    api = system.request("POST", "/api/v1/models", json=sim_model("sim-bad", replicas="many"))
    assert api.status_code == 422, api.text
    resp = admin.request("POST", "/ui/apply", data={"spec": invalid, "op": "apply"})
    assert resp.status_code == 422
    p = page(resp)
    assert words(p, "editor-error") == " ".join(api.json()["error"]["message"].split()) and "replicas" in words(
        p, "editor-error")
    assert p.get("spec-editor").raw == invalid
    assert system.request("GET", "/api/v1/models/sim-bad").status_code == 404


def test_diff_shows_the_changed_line_without_applying(system: System, admin: Browser) -> None:
    """Diff of the current model with replicas 3 shows "-  replicas: 1" and "+  replicas: 3" in #diff, and
    the model still wants 1."""
    text = yaml.safe_dump(sim_model(MODEL, replicas=3), sort_keys=False)
    resp = admin.request("POST", "/ui/apply", data={"spec": text, "op": "diff"})
    assert resp.status_code == 200, resp.text
    diff = page(resp).get("diff").raw
    assert "\n-  replicas: 1\n" in diff and "\n+  replicas: 3\n" in diff, diff
    assert page(resp).get("spec-editor").raw == text
    assert system.get(f"/api/v1/models/{MODEL}")["spec"]["replicas"] == 1


def test_apply_creates_the_model_which_becomes_ready_and_its_replica_log_has_lines(system: System,
                                                                                   admin: Browser) -> None:
    """Apply from the editor creates the model (303 to its page), it turns Ready through the REST API, and the
    replica's Logs link opens a page whose #replica-log (and its 2 s fragment) holds the engine's lines."""
    text = yaml.safe_dump(sim_model("sim-ed"), sort_keys=False)
    resp = admin.request("POST", "/ui/apply", data={"spec": text, "op": "apply"})
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/models/sim-ed", resp.text
    try:
        system.wait_model("sim-ed")
        p = page(admin.request("GET", "/ui/models/sim-ed"))
        assert list(phases(p).values()) == ["Ready"], phases(p)
        logs = [link for link in p.links() if "/replicas/" in link and link.endswith("/logs")]
        assert len(logs) == 1, p.links()
        log = page(admin.request("GET", logs[0]))
        assert log.get("replica-log").raw.strip(), log.text
        tail = page(admin.request("GET", logs[0] + "/tail"))
        assert len(tail.get("replica-log").raw.strip().splitlines()) >= 1
        missing = admin.request("GET", "/ui/models/sim-ed/replicas/nope/logs")
        assert missing.status_code == 404 and "no replica nope" in words(page(missing), "log-error")
    finally:
        system.request("DELETE", "/api/v1/models/sim-ed")


def test_live_part_draws_the_weights_fetch_as_a_bar_of_its_bytes(system: System, admin: Browser,
                                                                  tmp_path: Path) -> None:
    """While a replica's weights come (8 MiB from a local server at 1 MB/s), its row has a <progress> whose value
    and max are the bytes the API reports (max: the file's size) with "fetching NN%" in words; once the model is
    Ready the bar is gone."""
    files = tmp_path / "files"
    files.mkdir()
    gguf = write_tiny_llama_gguf(files / "tiny.gguf")
    with gguf.open("ab") as f:
        f.write(b"\0" * (8 * MIB - gguf.stat().st_size))
    with FlakyHttp(files, rate_bps=1_000_000) as srv:
        system.apply(sim_model("sim-fetch", source=f"{srv.url}/tiny.gguf",
                               source_sha256=hashlib.sha256(gguf.read_bytes()).hexdigest()))
        try:
            def drawn() -> Node | None:
                live = page(admin.request("GET", "/ui/models/sim-fetch/live"))
                bar = live.find(lambda n: n.tag == "progress" and int(n.attrs.get("value") or 0) > 0)
                return live if bar is not None else None

            live = wait_for(drawn, timeout=30, interval=0.2, what="a weights progress bar with bytes done")
            bar = live.find(lambda n: n.tag == "progress" and "value" in n.attrs)
            assert bar is not None
            assert int(bar.attrs["max"]) == 8 * MIB and 0 < int(bar.attrs["value"]) <= 8 * MIB, bar.attrs
            words = live.find(lambda n: "progress-words" in n.attrs.get("class", ""))
            assert words is not None and words.text.startswith("weights fetching ") and "of 8.0 MiB" in words.text
            system.wait_model("sim-fetch", timeout=60)
            after = page(admin.request("GET", "/ui/models/sim-fetch/live"))
            assert after.find(lambda n: n.tag == "progress") is None
        finally:
            system.request("DELETE", "/api/v1/models/sim-fetch")


def test_rollout_state_while_a_changed_spec_replaces_the_replicas(system: System, admin: Browser) -> None:
    """Two Ready replicas are "up to date"; a spec change (new engine args, its replicas slow to start) shows
    "rolling: N of 2 updated, M on the old spec" on the live part, then "up to date" once it is done."""
    def rollout() -> str:
        return page(admin.request("GET", "/ui/models/sim-roll/live")).get("rollout").text

    system.apply(sim_model("sim-roll", replicas=2))
    try:
        system.wait_model("sim-roll")
        assert rollout() == "Rollout: up to date"
        system.apply(sim_model("sim-roll", replicas=2, args=["--startup-delay", "4"]))
        seen = wait_for(lambda: (t := rollout()).startswith("Rollout: rolling:") and t, timeout=30, interval=0.2,
                        what="the rollout shown as rolling")
        assert seen in {f"Rollout: rolling: {u} of 2 updated, {o} on the old spec" for u in (0, 1) for o in (1, 2)}
        wait_for(lambda: rollout() == "Rollout: up to date", timeout=90, interval=0.5, what="the rollout done")
        assert all(r["current"] and r["phase"] == "Ready"
                   for r in system.get("/api/v1/models/sim-roll/describe")["replicas"] if r["phase"] != "Terminating")
    finally:
        system.request("DELETE", "/api/v1/models/sim-roll")
