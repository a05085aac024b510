"""``kind: Adapter``: parsed and refused by field, joined to its base's ``spec.adapters`` with the label that
marks it applied on its own, kept when the base's file is applied again, and stored as 0.2.0 reads a model."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmgw.core import adapterkind, adapters, specs
from llmgw.core.errors import SpecError


def model_doc(engine: str = "vllm", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "base"},
            "spec": {"engine": engine, "source": "hf://org/base", **spec}}


def adapter_doc(name: str = "base-sql", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Adapter", "metadata": {"name": name},
            "spec": {"base": "base", "source": "hf://org/sql-lora", **spec}}


def test_an_adapter_file_parses_and_round_trips() -> None:
    item = adapterkind.parse(adapter_doc(rank=8))
    assert item == adapterkind.AdapterManifest("base", adapters.Adapter("base-sql", "hf://org/sql-lora", 8))
    assert adapterkind.parse(item.to_manifest()) == item
    assert adapterkind.is_adapter(item.to_manifest()) and not adapterkind.is_adapter(model_doc())


@pytest.mark.parametrize(("doc", "field", "words"), [
    ({**adapter_doc(), "kind": "Model"}, "kind", "must be 'Adapter'"),
    (adapter_doc("Bad Name"), "metadata.name", "not a valid name"),
    (adapter_doc(base=""), "spec.base", "the name of the model"),
    (adapter_doc(source="ftp://x"), "spec.source", "unsupported source"),
    (adapter_doc(rank=-1), "spec.rank", ""),
    (adapter_doc(bogus=1), "spec.bogus", ""),
])
def test_a_bad_adapter_file_is_refused_naming_the_field(doc: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        adapterkind.parse(doc)
    assert e.value.field == field and words in str(e.value)


def test_attach_joins_the_base_and_marks_it_applied_on_its_own() -> None:
    base = specs.parse_manifest(model_doc(adapters=[{"name": "own", "source": "/srv/own"}]))
    joined = adapterkind.attach(base, adapterkind.parse(adapter_doc()))
    assert adapters.names(joined.spec.adapters) == ("own", "base-sql")
    assert adapterkind.attached(joined) == ("base-sql",)
    assert dict(joined.labels)[adapterkind.ATTACHED_LABEL] == "base-sql"
    # Stored and read back (the store parses with stored=True), it is the same model.
    assert specs.parse_manifest(joined.to_manifest(), stored=True) == joined
    again = adapterkind.attach(joined, adapterkind.parse(adapter_doc(source="/srv/sql2")))
    assert [a.source for a in again.spec.adapters] == ["file:///srv/own", "file:///srv/sql2"]
    assert [e["applied"] for e in adapterkind.entries(again)] == ["Model", "Adapter"]


def test_attach_refuses_a_name_the_file_lists_and_an_engine_without_adapters() -> None:
    base = specs.parse_manifest(model_doc(adapters=[{"name": "own", "source": "/srv/own"}]))
    with pytest.raises(SpecError, match="listed in model base's spec.adapters"):
        adapterkind.attach(base, adapterkind.parse(adapter_doc("own")))
    other = dataclasses.replace(base, spec=dataclasses.replace(base.spec, engine="tei", adapters=()))
    with pytest.raises(SpecError) as e:
        adapterkind.attach(other, adapterkind.parse(adapter_doc()))
    assert e.value.field == "spec.base" and f"runs engine {other.spec.engine}" in str(e.value)


def test_reapplying_the_base_keeps_what_was_applied_on_its_own_and_detach_removes_it() -> None:
    base = specs.parse_manifest(model_doc())
    joined = adapterkind.attach(base, adapterkind.parse(adapter_doc()))
    reapplied = adapterkind.carry(joined, specs.parse_manifest(model_doc(replicas=3)))
    assert reapplied.spec.replicas == 3 and adapterkind.attached(reapplied) == ("base-sql",)
    # The file takes the name over: from then on it is the file's adapter.
    listed = specs.parse_manifest(model_doc(adapters=[{"name": "base-sql", "source": "/srv/x"}]))
    taken = adapterkind.carry(joined, listed)
    assert adapterkind.attached(taken) == () and [a.source for a in taken.spec.adapters] == ["file:///srv/x"]
    # The model as `get model -o yaml` wrote it, applied again (edited): what was applied on its own stays so.
    round_trip = specs.parse_manifest(dataclasses.replace(joined, spec=dataclasses.replace(
        joined.spec, replicas=2)).to_manifest())
    again = adapterkind.carry(joined, round_trip)
    assert adapterkind.attached(again) == ("base-sql",) and again.spec.replicas == 2
    assert adapters.names(again.spec.adapters) == ("base-sql",)
    # A label written in the file by hand is not the file's to set.
    forged = specs.parse_manifest({**model_doc(), "metadata": {"name": "base",
                                                               "labels": {adapterkind.ATTACHED_LABEL: "zz"}}})
    assert adapterkind.carry(None, forged).labels == ()
    detached = adapterkind.detach(joined, "base-sql")
    assert detached.spec.adapters == () and detached.labels == ()
    with pytest.raises(SpecError, match="not applied on its own"):
        adapterkind.detach(taken, "base-sql")
