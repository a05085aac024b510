"""Model files: what is accepted, and that every refusal names the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmgw.core import specs, units
from llmgw.core.errors import SpecError

BASE: dict[str, Any] = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m1"},
                        "spec": {"engine": "sim"}}


def doc(**spec: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    d["spec"].update(spec)
    return d


def test_minimal_sim_model_gets_defaults() -> None:
    """A sim model needs only an engine; served name defaults to the model name."""
    m = specs.parse_manifest(doc())
    assert m.name == "m1" and m.spec.served_name == "m1" and m.spec.replicas == 1
    assert m.spec.startup_timeout_s == specs.DEFAULT_STARTUP_TIMEOUT_S


def test_full_llamacpp_model_round_trips() -> None:
    """Every field parses, and the canonical manifest reads back to the same model."""
    m = specs.parse_manifest(doc(engine="llamacpp", source="/srv/m.gguf", served_name="tiny", replicas=3,
                                 resources={"memory": "1.5GiB", "cpu_threads": 2}, startup_timeout="2m30s",
                                 engine_args=["--ctx-size", 4096], env={"A": 1}, aliases=["smol"],
                                 routing="least_outstanding"))
    assert m.spec.source == "file:///srv/m.gguf"
    assert m.spec.resources.memory_bytes == int(1.5 * 2**30) and m.spec.resources.cpu_threads == 2
    assert m.spec.startup_timeout_s == 150 and m.spec.engine_args == ("--ctx-size", "4096")
    assert m.spec.env == (("A", "1"),) and m.spec.aliases == ("smol",) and m.spec.routing == "least_outstanding"
    assert specs.parse_manifest(m.to_manifest()) == m


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"replcas": 2}, "spec.replcas", "did you mean 'replicas'"),
    ({"engine": "vlm"}, "spec.engine", "unknown engine"),
    ({"replicas": -1}, "spec.replicas", "between 0 and"),
    ({"replicas": "two"}, "spec.replicas", "whole number"),
    ({"replicas": True}, "spec.replicas", "whole number"),
    ({"engine": "llamacpp"}, "spec.source", "needs weights"),
    ({"engine": "llamacpp", "source": "hf:foo"}, "spec.source", "unsupported source"),
    ({"engine": "llamacpp", "source": "file://rel/x.gguf"}, "spec.source", "absolute path"),
    ({"resources": {"memory": "lots"}}, "spec.resources.memory", "512MiB"),
    ({"resources": {"gpus": 1}}, "spec.resources.gpus", "unknown field"),
    ({"startup_timeout": "soon"}, "spec.startup_timeout", "90s"),
    ({"startup_timeout": 0}, "spec.startup_timeout", "at least 1s"),
    ({"engine_args": "--foo"}, "spec.engine_args", "list of strings"),
    ({"engine_args": ["--port", "9"]}, "spec.engine_args[0]", "set by llmgw"),
    ({"engine_args": ["--host=0.0.0.0"]}, "spec.engine_args[0]", "set by llmgw"),
    ({"engine_args": [{"a": 1}]}, "spec.engine_args[0]", "expected a string"),
    ({"env": {"1BAD": "x"}}, "spec.env.1BAD", "environment variable"),
    ({"served_name": "has space"}, "spec.served_name", "without spaces"),
    ({"aliases": "smol"}, "spec.aliases", "list of names"),
    ({"aliases": ["a", "a"]}, "spec.aliases[1]", "listed twice"),
    ({"aliases": ["m1"]}, "spec.aliases[0]", "served name"),
    ({"routing": "random"}, "spec.routing", "unknown policy"),
])
def test_bad_spec_fields_are_named(change: dict[str, Any], field: str, words: str) -> None:
    """Each invalid value is refused with its dotted field path and a reason."""
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(**change))
    assert e.value.field == field
    assert words in str(e.value)


@pytest.mark.parametrize(("top", "field"), [
    ({"apiVersion": "v2"}, "apiVersion"), ({"kind": "Pod"}, "kind"),
    ({"metadata": {"name": "Bad_Name"}}, "metadata.name"), ({"metadata": "x"}, "metadata"),
    ({"spec": None}, "spec"), ({"extra": 1}, "extra"),
])
def test_bad_top_level_is_named(top: dict[str, Any], field: str) -> None:
    """Header mistakes name their field too."""
    d = copy.deepcopy(BASE)
    d.update(top)
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(d)
    assert e.value.field == field


def test_not_a_mapping() -> None:
    """A list or scalar document is refused with what a model file must be."""
    with pytest.raises(SpecError, match="must be a mapping"):
        specs.parse_manifest(["x"])


def test_fingerprint_ignores_replicas_but_not_args() -> None:
    """Scaling does not roll replicas; changing engine args does."""
    a = specs.parse_manifest(doc(replicas=1)).spec
    same = specs.parse_manifest(doc(replicas=5, aliases=["x"], routing="round_robin")).spec
    assert a.fingerprint() == same.fingerprint()
    assert a.fingerprint() != specs.parse_manifest(doc(engine_args=["--decode-tps", "9"])).spec.fingerprint()


@pytest.mark.parametrize(("text", "value"), [("512MiB", 512 * 2**20), ("1G", 10**9), (1024, 1024),
                                             ("2 GiB", 2 * 2**30), ("0", 0)])
def test_parse_bytes(text: object, value: int) -> None:
    """Sizes in SI and binary units."""
    assert units.parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["-1", "1XB", "", None, True, -5])
def test_parse_bytes_refuses(bad: object) -> None:
    """Nonsense sizes raise ValueError naming the accepted forms."""
    with pytest.raises(ValueError, match="512MiB"):
        units.parse_bytes(bad)


@pytest.mark.parametrize(("text", "value"), [("90s", 90), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), (7, 7)])
def test_parse_duration(text: object, value: float) -> None:
    """Durations in ms, s, m, h and combinations."""
    assert units.parse_duration(text) == value


@pytest.mark.parametrize("bad", ["5 minutes", "m5", "", "5m3", False])
def test_parse_duration_refuses(bad: object) -> None:
    """Anything else is refused."""
    with pytest.raises(ValueError):
        units.parse_duration(bad)
