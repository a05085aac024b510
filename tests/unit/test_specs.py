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
    ({"resources": {"gpu": 1}}, "spec.resources.gpu", "did you mean 'gpus'"),
    ({"resources": {"gpus": {"count": 2, "tensor_paralel": 2}}}, "spec.resources.gpus.tensor_paralel",
     "did you mean 'tensor_parallel'"),
    ({"resources": {"gpus": {"count": 4, "tensor_parallel": 2}}}, "spec.resources.gpus.count",
     "tensor_parallel x pipeline_parallel is 2"),
    ({"resources": {"gpus": {"memory": "40GiB"}}}, "spec.resources.gpus.count", "required"),
    ({"resources": {"gpus": {"count": 0, "memory": "40GiB"}}}, "spec.resources.gpus.count", "other GPU"),
    ({"resources": {"gpus": {"count": 1, "memory": "lots"}}}, "spec.resources.gpus.memory", "512MiB"),
    ({"resources": {"gpus": {"count": 1, "compute_capability": "sm80"}}},
     "spec.resources.gpus.compute_capability", "MAJOR.MINOR"),
    ({"resources": {"gpus": {"tensor_parallel": 3}, "nnodes": 2}}, "spec.resources.gpus", "does not divide"),
    ({"resources": {"nnodes": 2}}, "spec.resources.nnodes", "only with GPUs"),
    ({"resources": {"gpus": 1, "nnodes": 0}}, "spec.resources.nnodes", "between 1 and"),
    ({"engine_verison": "1"}, "spec.engine_verison", "did you mean 'engine_version'"),
    ({"engine_version": "0.11 beta"}, "spec.engine_version", "not a version"),
    ({"node_selector": {"rack": 12}}, "spec.node_selector.rack", "quote it"),
    ({"node_selector": {"gpus": "8"}}, "spec.node_selector.gpus", "measured on the node"),
    ({"node_selector": {"pool": "a"}}, "spec.node_selector.pool", "spec.pool"),
    ({"node_selector": {"bad key": "a"}}, "spec.node_selector.bad key", "label name"),
    ({"node_selector": ["rack"]}, "spec.node_selector", "mapping"),
    ({"pool": "a b"}, "spec.pool", "label value"),
    ({"placement": "pack"}, "spec.placement", "spread, binpack"),
    ({"priority": "high"}, "spec.priority", "whole number"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "spec.env.CUDA_VISIBLE_DEVICES", "spec.resources.gpus"),
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


def test_profile_fields_round_trip() -> None:
    """GPUs, nnodes, engine version, selector, pool, placement and priority parse and read back unchanged."""
    m = specs.parse_manifest(doc(engine_version=0.11, node_selector={"rack": "r12"}, pool="research",
                                 placement="binpack", priority=10,
                                 resources={"memory": "32GiB", "nnodes": 2,
                                            "gpus": {"memory": "40GiB", "compute_capability": 8.0,
                                                     "tensor_parallel": 8, "pipeline_parallel": 2}}))
    s = m.spec
    assert s.engine_version == "0.11" and s.node_selector == (("rack", "r12"),) and s.pool == "research"
    assert s.placement == "binpack" and s.priority == 10
    assert s.resources.nnodes == 2 and s.resources.gpus == specs.Gpus(8, 40 * 2**30, "8.0", 8, 2)
    assert specs.parse_manifest(m.to_manifest()) == m
    cpu = specs.parse_manifest(doc())
    assert "gpus" not in cpu.to_manifest()["spec"]["resources"] and specs.parse_manifest(cpu.to_manifest()) == cpu


def test_gpu_count_defaults_and_short_form() -> None:
    """``gpus: 2`` is a count; tensor_parallel alone gives the count; a CPU model states none."""
    assert specs.parse_manifest(doc(resources={"gpus": 2})).spec.resources.gpus.count == 2
    assert specs.parse_manifest(doc(resources={"gpus": {"tensor_parallel": 4}})).spec.resources.gpus.count == 4
    assert specs.parse_manifest(doc()).spec.resources.gpus == specs.Gpus()
    assert specs.parse_manifest(doc()).spec.placement == "spread"


def test_fingerprint_covers_where_but_not_order() -> None:
    """Selector, pool, GPUs and engine version roll replicas; placement policy and priority do not."""
    base = specs.parse_manifest(doc()).spec.fingerprint()
    assert specs.parse_manifest(doc(placement="binpack", priority=5)).spec.fingerprint() == base
    for change in ({"pool": "a"}, {"node_selector": {"rack": "r1"}}, {"resources": {"gpus": 1}},
                   {"engine_version": "1.2"}):
        assert specs.parse_manifest(doc(**change)).spec.fingerprint() != base, change


def test_fingerprint_of_a_model_without_new_fields_is_unchanged() -> None:
    """A model using no profile field hashes as before they existed, so an upgrade restarts no engine."""
    import hashlib
    import json

    m = specs.parse_manifest(doc(engine_args=["--decode-tps", "9"], resources={"memory": "1GiB", "cpu_threads": 2}))
    before = {"engine": "sim", "served_name": "m1", "source": "", "startup_timeout_s": 600.0,
              "resources": {"memory_bytes": 2**30, "cpu_threads": 2}, "engine_args": ["--decode-tps", "9"],
              "env": []}
    assert m.spec.fingerprint() == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
