"""``llmgw server`` runs no SQL on its event loop: every store call goes to the store's thread."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model


def _statements_on_loop(system: System) -> float:
    text = system.request("GET", "/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "llmgw_store_statements_on_loop_total":
                return float(s.value)
    raise AssertionError("llmgw_store_statements_on_loop_total is not served on /metrics")


def test_no_store_call_runs_on_the_event_loop(system: System) -> None:
    """Registration, reconcile passes, routing and every REST resource run no SQL statement on the loop thread."""
    system.apply(sim_model("m"))
    system.wait_model("m")
    system.wait_router("m", 1)
    for path in ("/api/v1/models", "/api/v1/models/m", "/api/v1/replicas", "/api/v1/nodes", "/api/v1/events",
                 "/api/v1/models/m/describe", "/api/v1/nodes/node1/describe", "/api/v1/keys"):
        system.get(path)
    key = system.request("POST", "/api/v1/keys", json={"name": "k"}).json()
    assert system.request("DELETE", f"/api/v1/keys/{key['id']}").status_code == 200
    for verb in ("cordon", "uncordon", "drain", "uncordon"):
        assert system.request("POST", f"/api/v1/nodes/node1/{verb}").status_code == 200
    assert system.request("DELETE", "/api/v1/models/m").status_code == 200
    assert system.request("GET", "/api/v1/models/gone").status_code == 404
    wait_for(lambda: not system.replicas("m"), timeout=30, what="m's replica stopped and deleted")
    assert _statements_on_loop(system) == 0
