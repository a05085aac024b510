"""A model's ``metadata.labels`` (issue 30, for ``llmgw get models -l``): kept in the canonical manifest, checked
like node labels, and outside the spec's fingerprint, so relabelling restarts nothing."""

from __future__ import annotations

import pytest

from llmgw.core import specs
from llmgw.core.errors import SpecError
from llmgw.testing.system import sim_model


def labelled(labels: object) -> dict[str, object]:
    doc = sim_model("chat")
    doc["metadata"]["labels"] = labels  # type: ignore[index]
    return doc


def test_labels_round_trip_sorted_and_leave_the_fingerprint_alone() -> None:
    m = specs.parse_manifest(labelled({"tier": "gold", "team": "ml"}))
    assert m.labels == (("team", "ml"), ("tier", "gold"))
    assert m.to_manifest()["metadata"] == {"name": "chat", "labels": {"team": "ml", "tier": "gold"}}
    assert specs.parse_manifest(m.to_manifest(), stored=True) == m
    plain = specs.parse_manifest(sim_model("chat"))
    assert plain.labels == () and plain.to_manifest()["metadata"] == {"name": "chat"}
    assert plain.spec.fingerprint() == m.spec.fingerprint()


@pytest.mark.parametrize(("labels", "said"), [
    ({"team": 5}, "metadata.labels.team: label values are strings"),
    ({"no spaces": "x"}, "metadata.labels.no spaces: not a valid label name"),
    (["team=ml"], "metadata.labels: expected a mapping, got list"),
])
def test_bad_labels_are_refused_naming_the_field(labels: object, said: str) -> None:
    with pytest.raises(SpecError, match=said):
        specs.parse_manifest(labelled(labels))
