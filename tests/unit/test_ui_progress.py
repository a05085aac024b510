"""The model page's progress and rollout, decided from the API's documents (llmgw.control.ui.progress)."""

from __future__ import annotations

from typing import Any

from llmgw.control.ui import progress

MIB = 2**20


def replica(rid: str, phase: str, *, current: bool) -> dict[str, Any]:
    return {"id": rid, "phase": phase, "current": current}


def model(desired: int, *replicas: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"replicas": desired}, "replicas": list(replicas)}


def test_fetch_bar_is_the_reported_bytes_and_says_them() -> None:
    """A fetch at 2 of 8 MiB is a bar of value 2 MiB, max 8 MiB, "fetching 25%", with its rate and time left."""
    got = progress.fetch_bar({"done_bytes": 2 * MIB, "total_bytes": 8 * MIB, "rate_bps": MIB, "eta_s": 6.0,
                              "state": "fetching", "message": ""})
    assert got is not None
    assert (got["value"], got["max"], got["pct"]) == (2 * MIB, 8 * MIB, 25)
    assert got["label"] == "fetching 25% · 2.0 MiB of 8.0 MiB · 1.0 MiB/s · 6 s left"


def test_fetch_of_unknown_size_has_no_percent_and_a_stall_says_why() -> None:
    """Total 0 (not known yet) gives max 0 (an indeterminate bar) and the bytes so far; a stall carries its reason."""
    got = progress.fetch_bar({"done_bytes": 3 * MIB, "total_bytes": 0, "state": "stalled",
                              "message": "no answer from mirror:8080 for 30 s"})
    assert got is not None and got["max"] == 0 and got["pct"] is None
    assert got["label"] == "stalled · 3.0 MiB so far · no answer from mirror:8080 for 30 s"
    assert progress.fetch_bar(None) is None


def test_install_bars_are_the_models_engine_installing_on_any_node() -> None:
    """Only Installing installs of the spec's engine whose version the engine_version prefix takes are shown."""
    engines = {"nodes": [
        {"node": "n1", "installs": [
            {"engine": "vllm", "version": "0.11.2", "state": "Installing", "message": "downloading",
             "bytes_done": 1 * MIB, "bytes_total": 4 * MIB},
            {"engine": "vllm", "version": "0.12.0", "state": "Installing", "message": "downloading",
             "bytes_done": 1, "bytes_total": 2},
            {"engine": "sglang", "version": "0.11.2", "state": "Installing", "bytes_done": 1, "bytes_total": 2}]},
        {"node": "n2", "installs": [{"engine": "vllm", "version": "0.11.2", "state": "Ready"},
                                    {"engine": "vllm", "version": "0.110.1", "state": "Installing"}]}]}
    got = progress.install_bars({"engine": "vllm", "engine_version": "0.11"}, engines)
    assert [(b["node"], b["version"], b["pct"]) for b in got] == [("n1", "0.11.2", 25)]
    assert got[0]["label"].startswith("downloading 25% · 1.0 MiB of 4.0 MiB")
    assert len(progress.install_bars({"engine": "vllm"}, engines)) == 3


def test_rollout_counts_ready_replicas_on_the_current_spec() -> None:
    """Two old Ready and one new Starting of three is "rolling: 0 of 3 updated, 2 on the old spec"; a new one
    Ready makes it 1 of 3; all current and Ready (a leaving old one aside) is "up to date"."""
    r = progress.rollout_of(model(3, replica("a", "Ready", current=False), replica("b", "Ready", current=False),
                                  replica("c", "Starting", current=True)))
    assert r["rolling"] and r["text"] == "rolling: 0 of 3 updated, 2 on the old spec"
    r = progress.rollout_of(model(3, replica("a", "Ready", current=False), replica("c", "Ready", current=True)))
    assert r["text"] == "rolling: 1 of 3 updated, 1 on the old spec"
    r = progress.rollout_of(model(2, replica("a", "Terminating", current=False), replica("c", "Ready", current=True),
                                  replica("d", "Ready", current=True)))
    assert not r["rolling"] and r["text"] == "up to date"


def test_scaling_up_is_not_a_rollout() -> None:
    """More replicas wanted than Ready, all on the current spec: up to date (Ready x/y tells the scaling)."""
    assert progress.rollout_of(model(3, replica("a", "Ready", current=True),
                                     replica("b", "Starting", current=True)))["text"] == "up to date"
