"""The UI's model page and list for an autoscaled model, against a real server, agent and sim engine.

Driven with ``llmgw.testing.uiclient`` (httpx as a browser, the page parsed into a tree), as
test_ui_model_page is: Cold at zero, the bounds instead of the scale buttons, then a request wakes
it and the page shows the autoscaler's decision and the load the routers reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model
from llmgw.testing.uiclient import Browser, Node, page

MODEL = "auto-ui"


def words(doc: Node, id_: str) -> str:
    return " ".join(doc.get(id_).text.split())


@pytest.fixture
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A server and agent with an autoscaled sim model, min 0 max 2, at zero."""
    with system_mod.running(tmp_path_factory.mktemp("uiauto")) as s:
        s.apply(sim_model(MODEL, autoscale={"min_replicas": 0, "max_replicas": 2, "queue_per_replica": 4,
                                            "scale_to_zero_after": "300s", "cold_start_timeout": "40s"}))
        s.wait_model(MODEL, "Cold")
        yield s


def test_autoscaled_model_page_shows_its_autoscaler_not_scale_buttons(system: System, admin: Browser) -> None:
    """Cold at zero with its bounds; no −/+; a request wakes it and the page shows the decision and the load."""
    p = page(admin.request("GET", f"/ui/models/{MODEL}"))
    assert p.by_id("scale-up") is None and p.by_id("scale-down") is None
    assert words(p, "autoscaled").startswith("autoscaled between 0 and 2 replicas")
    assert words(p, "model-state").startswith("Cold 0/0")
    count = words(p, "autoscale-count")
    assert count.startswith("0 in force, between 0 and 2") and "the next request starts one" in count, count
    assert words(p, "autoscale-last") == "no change yet"
    listed = page(admin.request("GET", "/ui/models"))
    row = listed.find(lambda n: n.tag == "tr" and n.attrs.get("data-model") == MODEL)
    assert row is not None and "0/0 (auto 0–2)" in " ".join(row.text.split()) and "Cold" in row.text
    # A scale POST anyway (an old tab's button): the API's 409 sentence, shown on the page.
    refused = admin.request("POST", f"/ui/models/{MODEL}/scale", data={"delta": "1"})
    assert refused.status_code == 409
    assert (f"model {MODEL} is autoscaled (min 0, max 2); change spec.autoscale.min_replicas/max_replicas instead"
            in words(page(refused), "model-error"))

    r = system.request("POST", "/v1/chat/completions", json={"model": MODEL, "max_tokens": 2,
                                                              "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text

    def woken() -> Node | None:
        live = page(admin.request("GET", f"/ui/models/{MODEL}/live"))
        return live if words(live, "model-state").startswith("Ready 1/1") else None

    live = wait_for(woken, timeout=20, interval=0.3, what="the page shows the model Ready")
    assert isinstance(live, Node)
    assert words(live, "autoscale-count").startswith("1 in force, between 0 and 2")
    last = words(live, "autoscale-last")
    # When, as ``core.humane`` says it: relative, the UTC time on hover (the <time>'s title).
    assert re.fullmatch(r"0 → 1: a request is waiting for a model at zero (just now|\d+s ago)", last), last
    assert re.search(r'<time datetime="[^"]+Z" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">',
                     admin.request("GET", f"/ui/models/{MODEL}/live").text)
    load = words(live, "autoscale-load")
    assert "waiting" in load and "in flight" in load and "TTFT p90" in load and "(from 1 router)" in load, load
    assert any("0 → 1: a request is waiting" in e.text for e in live.get("model-events").find_all(
        lambda n: n.tag == "tr"))
