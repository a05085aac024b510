"""spec.autoscale in model files: parsed, refused by field, written back, and outside the fingerprint."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmgw.core import autoscale, specs
from llmgw.core.errors import SpecError

BASE: dict[str, Any] = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m1"},
                        "spec": {"engine": "sim"}}
AUTO: dict[str, Any] = {"min_replicas": 0, "max_replicas": 4, "queue_per_replica": 2}
MANUAL_REFUSAL = ("spec.replicas: autoscale sets the replica count (between min_replicas and max_replicas); "
                  "remove spec.replicas, or remove spec.autoscale to set it by hand")


def doc(auto: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    d["spec"].update(spec)
    if auto is not None:
        d["spec"]["autoscale"] = auto
    return d


def test_full_autoscale_parses_with_durations() -> None:
    """Every field parses; durations take units; replicas becomes min_replicas (a floor)."""
    m = specs.parse_manifest(doc({"min_replicas": 0, "max_replicas": 4, "queue_per_replica": 2,
                                  "ttft_p90_ms": 500, "inflight_per_replica": 8, "tokens_per_s_per_replica": 200,
                                  "scale_up_after": "15s", "scale_down_after": "2m", "scale_to_zero_after": "5m",
                                  "cold_start_timeout": 45}))
    assert m.spec.autoscale == autoscale.Autoscale(
        min_replicas=0, max_replicas=4, queue_per_replica=2, ttft_p90_ms=500, inflight_per_replica=8,
        tokens_per_s_per_replica=200, scale_up_after_s=15, scale_down_after_s=120, scale_to_zero_after_s=300,
        cold_start_timeout_s=45)
    assert m.spec.replicas == 0


def test_defaults_fill_the_windows_and_min() -> None:
    """Unset windows take the contract's defaults; an unset min_replicas is 1; unset targets are 0."""
    a = specs.parse_manifest(doc({"max_replicas": 3, "inflight_per_replica": 4})).spec.autoscale
    assert a == autoscale.Autoscale(min_replicas=1, max_replicas=3, inflight_per_replica=4)
    assert (a.scale_up_after_s, a.scale_down_after_s, a.scale_to_zero_after_s, a.cold_start_timeout_s) == (
        15.0, 120.0, 300.0, 60.0)


def test_without_autoscale_nothing_changes() -> None:
    """A model without autoscale keeps its manual count and no autoscale field in its document."""
    m = specs.parse_manifest(doc(replicas=3))
    assert m.spec.autoscale is None and m.spec.replicas == 3
    assert "autoscale" not in m.to_manifest()["spec"] and m.to_manifest()["spec"]["replicas"] == 3
    assert specs.parse_manifest(doc(None, replicas=2, autoscale=None)).spec.autoscale is None


@pytest.mark.parametrize("replicas", [0, 1, 3])
def test_manual_replicas_with_autoscale_is_refused(replicas: int) -> None:
    """spec.replicas beside spec.autoscale is refused with the sentence that says which to remove."""
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(AUTO, replicas=replicas))
    assert e.value.field == "spec.replicas" and str(e.value) == MANUAL_REFUSAL


def test_round_trip_omits_replicas_and_reads_back() -> None:
    """to_manifest writes autoscale (seconds) and no replicas; parse reads it back equal, stored or not."""
    m = specs.parse_manifest(doc({**AUTO, "ttft_p90_ms": 500, "scale_down_after": "3m"}))
    out = m.to_manifest()["spec"]
    assert "replicas" not in out
    assert out["autoscale"] == {"min_replicas": 0, "max_replicas": 4, "queue_per_replica": 2.0, "ttft_p90_ms": 500.0,
                                "scale_up_after": 15.0, "scale_down_after": 180.0, "scale_to_zero_after": 300.0,
                                "cold_start_timeout": 60.0}
    assert specs.parse_manifest(m.to_manifest()) == m
    assert specs.parse_manifest(m.to_manifest(), stored=True) == m


def test_fingerprint_ignores_autoscale() -> None:
    """Adding, changing or removing autoscale leaves the fingerprint: no engine restarts for it."""
    manual = specs.parse_manifest(doc(replicas=1)).spec
    auto = specs.parse_manifest(doc(AUTO)).spec
    other = specs.parse_manifest(doc({"min_replicas": 2, "max_replicas": 9, "ttft_p90_ms": 300,
                                      "scale_up_after": "1m"})).spec
    assert manual.fingerprint() == auto.fingerprint() == other.fingerprint()
    assert specs.parse_manifest(doc(AUTO, served_name="x")).spec.fingerprint() != auto.fingerprint()


@pytest.mark.parametrize(("auto", "field", "words"), [
    ("yes", "spec.autoscale", "expected a mapping"),
    ({**AUTO, "max_replcas": 3}, "spec.autoscale.max_replcas", "did you mean 'max_replicas'"),
    ({"min_replicas": 0, "queue_per_replica": 2}, "spec.autoscale.max_replicas", "required"),
    ({**AUTO, "max_replicas": 0}, "spec.autoscale.max_replicas", "between 1 and"),
    ({**AUTO, "min_replicas": 5}, "spec.autoscale.max_replicas", "4 is below min_replicas (5)"),
    ({**AUTO, "min_replicas": -1}, "spec.autoscale.min_replicas", "between 0 and"),
    ({**AUTO, "min_replicas": 1.5}, "spec.autoscale.min_replicas", "whole number"),
    ({**AUTO, "max_replicas": True}, "spec.autoscale.max_replicas", "whole number"),
    ({"min_replicas": 0, "max_replicas": 4}, "spec.autoscale", "at least one target"),
    ({**AUTO, "queue_per_replica": 0}, "spec.autoscale.queue_per_replica", "above 0"),
    ({**AUTO, "ttft_p90_ms": -5}, "spec.autoscale.ttft_p90_ms", "above 0"),
    ({**AUTO, "inflight_per_replica": "8"}, "spec.autoscale.inflight_per_replica", "above 0"),
    ({**AUTO, "tokens_per_s_per_replica": float("inf")}, "spec.autoscale.tokens_per_s_per_replica", "above 0"),
    ({**AUTO, "tokens_per_s_per_replica": float("nan")}, "spec.autoscale.tokens_per_s_per_replica", "above 0"),
    ({**AUTO, "queue_per_replica": True}, "spec.autoscale.queue_per_replica", "above 0"),
    ({**AUTO, "scale_up_after": "soon"}, "spec.autoscale.scale_up_after", "90s"),
    ({**AUTO, "scale_down_after": -1}, "spec.autoscale.scale_down_after", "negative"),
    ({**AUTO, "scale_to_zero_after": "5 minutes"}, "spec.autoscale.scale_to_zero_after", "90s"),
    ({**AUTO, "cold_start_timeout": "500ms"}, "spec.autoscale.cold_start_timeout", "at least 1s"),
])
def test_refusals_name_the_field(auto: Any, field: str, words: str) -> None:
    """Each bad autoscale value is refused with a SpecError on its own dotted field and a reason."""
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(auto))
    assert e.value.field == field and words in e.value.reason


def test_min_equal_max_and_zero_windows_are_accepted() -> None:
    """min == max (a fixed count under autoscale) and windows of 0 (act at once) are valid."""
    a = specs.parse_manifest(doc({"min_replicas": 2, "max_replicas": 2, "queue_per_replica": 1,
                                  "scale_up_after": 0, "scale_down_after": "0s"})).spec.autoscale
    assert a is not None and (a.min_replicas, a.max_replicas, a.scale_up_after_s, a.scale_down_after_s) == (
        2, 2, 0.0, 0.0)
