"""How an autoscaled model reads to a person: the Autoscaling condition, `get models`' READY cell, the
`describe` Targets line, the UI's autoscaler panel, and the test harness's autoscaled sim manifest."""

from __future__ import annotations

import dataclasses
from typing import Any

from llmgw.cli import describe, tables
from llmgw.control import conditions, status
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.ui import models_page
from llmgw.core import specs
from llmgw.testing.system import sim_model

AUTO = {"min_replicas": 0, "max_replicas": 3, "inflight_per_replica": 2, "scale_up_after": "3s",
        "scale_down_after": "6s", "scale_to_zero_after": "15s", "cold_start_timeout": "30s"}


def manifest_doc() -> dict[str, Any]:
    """The manifest as the API returns it (canonical: durations as seconds)."""
    return specs.parse_manifest(sim_model("chat", autoscale=AUTO)).to_manifest()


def test_at_max_the_condition_names_the_cap_once() -> None:
    """AtMaxReplicas reads "held at max_replicas 4: the load asks for 6 (...)", not "held at 4 replicas, at max..."."""
    spec = specs.parse_manifest(sim_model("chat", autoscale=AUTO)).spec
    c = conditions.autoscaling(spec, replicas=3, limited="at max_replicas 3: the load asks for 6 (in flight 4.0 per "
                               "replica > target 2)", unplaceable=False)
    assert (c.status, c.reason) == ("False", "AtMaxReplicas")
    assert c.message == ("held at max_replicas 3: the load asks for 6 (in flight 4.0 per replica > target 2); "
                         "raise spec.autoscale.max_replicas to follow it")
    assert c.message.count("3") == 1
    other = conditions.autoscaling(spec, replicas=2, limited="some other limit", unplaceable=False)
    assert other.message.startswith("held at 2 replicas, some other limit;")


def test_get_models_ready_cell_shows_the_autoscalers_bounds() -> None:
    """READY is "ready/in force", and an autoscaled model's adds "(auto MIN–MAX)"; a manual one's does not."""
    doc = manifest_doc()
    doc["status"] = {"ready_replicas": 1, "replicas": 2}
    assert tables.ready_cell(doc) == "1/2 (auto 0–3)"
    manual = specs.parse_manifest(sim_model("m", replicas=2)).to_manifest()
    manual["status"] = {"ready_replicas": 2, "replicas": 2}
    assert tables.ready_cell(manual) == "2/2"


def test_describe_targets_line_names_each_set_target_and_the_windows() -> None:
    """Targets: the set targets in words, the windows, to-zero only with min 0, and the cold-start timeout."""
    spec = manifest_doc()["spec"]["autoscale"]
    assert describe.autoscale_targets(spec) == ("in flight 2 per replica; up after 3s, down after 6s, to zero after "
                                                "15s idle; cold start up to 30s")
    floor = specs.parse_manifest(sim_model("m", autoscale={**AUTO, "min_replicas": 1, "queue_per_replica": 4,
                                                           "ttft_p90_ms": 500})).to_manifest()["spec"]["autoscale"]
    line = describe.autoscale_targets(floor)
    assert line.startswith("queue 4 per replica, in flight 2 per replica, TTFT p90 500 ms;") and "to zero" not in line


def test_ui_panel_words_the_last_decision_and_the_load() -> None:
    """The model page's autoscaler panel: bounds, count, the last sentence with its age, the merged signals."""
    doc = {"autoscale": {"replicas": 2, "min_replicas": 0, "max_replicas": 3, "last_reason": "1 → 2: queue 5 per "
                         "replica > target 2 for 3s", "last_change_at": 1000.0, "routers": ["server"],
                         "signals": {"arrived_per_s": 4.25, "waiting": 3.0, "in_flight": 5.0, "ttft_p90_ms": 412.3,
                                     "tokens_per_s": 80.0, "last_request_at": 1040.0, "wanted": False}}}
    view = models_page.autoscale_view(doc, now=1045.0)
    assert view is not None
    assert (view["min"], view["max"], view["replicas"], view["ago"]) == (0, 3, 2, "45s")
    assert view["last"].startswith("1 → 2: queue 5")
    assert view["load"] == {"waiting": "3", "in_flight": "5", "ttft_p90": "412 ms", "arrivals": "4.2/s",
                            "routers": "1"}
    doc["autoscale"].update(signals=None, last_reason="", last_change_at=0.0)
    quiet = models_page.autoscale_view(doc, now=1045.0)
    assert quiet is not None and quiet["last"] == "no change yet" and quiet["ago"] == ""
    assert "the count holds" in quiet["load"]["none"]
    assert models_page.autoscale_view({"status": {}}, now=1045.0) is None


def test_sim_model_with_autoscale_leaves_replicas_out_and_parses() -> None:
    """``sim_model(autoscale=...)`` writes no replicas (both together are refused) and parses as autoscaled."""
    doc = sim_model("chat", autoscale=AUTO)
    assert "replicas" not in doc["spec"] and doc["spec"]["autoscale"] == AUTO
    spec = specs.parse_manifest(doc).spec
    assert spec.autoscale is not None and spec.autoscale.max_replicas == 3 and spec.replicas == 0
    assert sim_model("m", replicas=2)["spec"]["replicas"] == 2


def test_a_scale_up_reads_as_scaling_up_not_as_a_fault() -> None:
    """Ready replicas plus new ones starting: state ScalingUp and Degraded False; a failed or refused one is trouble."""
    auto = specs.parse_manifest(sim_model("chat", autoscale=AUTO)).spec
    spec = dataclasses.replace(auto, replicas=4)  # the count in force

    def rec(i: int, phase: Phase, **kw: Any) -> ReplicaRecord:
        return ReplicaRecord(id=f"chat-{i}", model="chat", fingerprint=spec.fingerprint(), phase=phase, api_key="k",
                             node_id="node1", **kw)

    rising = [rec(0, Phase.READY), rec(1, Phase.READY), rec(2, Phase.STARTING), rec(3, Phase.PENDING)]
    st = status.summarize(spec, rising, now=0.0)
    assert st.state == "ScalingUp" and st.message.startswith("2 of 4 replicas Ready: the autoscaler raised the count")
    degraded = {c.type: c for c in conditions.model_conditions(spec, rising, {}, {})}["Degraded"]
    assert (degraded.status, degraded.reason) == ("False", "ScalingUp")
    refused = rising[:3] + [rec(3, Phase.PENDING, message="no node has 2 free GPUs")]
    assert status.summarize(spec, refused, now=0.0).state == "Degraded"
    failed = rising[:3] + [rec(3, Phase.PENDING, failures=1, message="exited 1")]
    assert {c.type: c for c in conditions.model_conditions(spec, failed, {}, {})}["Degraded"].status == "True"
    manual = dataclasses.replace(spec, autoscale=None)
    assert status.summarize(manual, rising, now=0.0).state == "Degraded"
