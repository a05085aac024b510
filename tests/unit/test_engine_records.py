"""Engine records: each one is whole and consistent, and every part reads its facts from it."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import pytest

from llmgw.agent import engines as adapters
from llmgw.agent.engines import base, llamacpp
from llmgw.cli.defaults import DEFAULT_MODEL
from llmgw.control.placement import needs
from llmgw.core import engines, specs
from llmgw.core.errors import SpecError
from llmgw.router import loadwatch, openai_shape, prefix, request

RECORDS = list(engines.ENGINES.values())
IDS = [e.name for e in RECORDS]


def _replace(monkeypatch: pytest.MonkeyPatch, name: str, **changes: Any) -> None:
    monkeypatch.setitem(engines.ENGINES, name, dataclasses.replace(engines.ENGINES[name], **changes))


def _manifest(**spec: Any) -> dict[str, Any]:
    return copy.deepcopy({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m1"},
                          "spec": {"engine": "sim", **spec}})


def test_spec_validation_accepts_exactly_the_runnable_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spec validation accepts every engine with an adapter (all four now); one marked not runnable is refused."""
    assert set(engines.KNOWN_ENGINES) == {"vllm", "sglang", "llamacpp", "sim"}
    assert {e.name for e in RECORDS if e.runnable} == set(engines.KNOWN_ENGINES)
    assert set(engines.KNOWN_ENGINES) == set(adapters._ADAPTERS)
    for name, record in engines.ENGINES.items():
        assert record.name == name and record.description
        assert engines.KNOWN_ENGINES.get(name, record.description) == record.description
    specs.parse_manifest(_manifest(engine="vllm", source="/models/llama"))
    monkeypatch.delitem(engines.KNOWN_ENGINES, "sglang")
    with pytest.raises(SpecError, match="unknown engine"):
        specs.parse_manifest(_manifest(engine="sglang", source="/models/llama"))


@pytest.mark.parametrize(("name", "multi", "workers_http", "key_env"), [
    ("vllm", True, False, "VLLM_API_KEY"), ("sglang", True, False, ""),
    ("llamacpp", False, True, "LLAMA_API_KEY"), ("sim", True, True, "LLMGW_SIM_API_KEY"),
])
def test_multi_node_worker_http_and_key_variable(name: str, multi: bool, workers_http: bool, key_env: str) -> None:
    """Each record says whether it spans nodes, whether worker ranks serve HTTP, and where its key goes."""
    record = engines.ENGINES[name]
    assert (record.multi_node, record.worker_ranks_serve_http, record.api_key_env) == (multi, workers_http, key_env)


def test_every_field_has_a_comment_saying_what_it_means() -> None:
    """Each field of the record is preceded by a ``#:`` comment in the source."""
    lines = inspect.getsource(engines.Engine).splitlines()
    for field in dataclasses.fields(engines.Engine):
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{field.name}:"))
        assert lines[at - 1].strip().startswith("#:"), field.name


@pytest.mark.parametrize("record", RECORDS, ids=IDS)
def test_each_record_is_consistent(record: engines.Engine) -> None:
    """Flags, context, metrics and behaviour of one record agree with each other."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.name = "x"  # type: ignore[misc]
    if record.runnable:
        # llmgw binds the engine and names what it serves: those flags are always its own.
        assert {"--host", "--port", "--model", "--api-key"} <= record.reserved_flags
        assert record.queue_metric and record.running_metric
    # The context is the user's to set: a context flag llmgw reserved could never be given.
    assert not set(record.context_flags) & record.reserved_flags
    assert all(f.startswith("-") for f in (*record.context_flags, *record.reserved_flags))
    assert record.context_default >= 0
    if record.context_default:
        assert record.context_flags, "a default context the user could not change"
    # Queue and running are read from different gauges, in the engine's own namespace.
    gauges = [g for g in (record.queue_metric, record.running_metric, *record.kv_usage_metrics) if g]
    assert len(gauges) == len(set(gauges))
    prefix_of = "llmgw_sim_" if record.name == "sim" else f"{record.name}:"
    assert all(g.startswith(prefix_of) for g in gauges), gauges
    # An engine that loads weights has a context; one that needs no source (the sim) has neither.
    assert record.needs_source == bool(record.context_flags)


def test_no_gauge_belongs_to_two_engines() -> None:
    """A scrape does not know its engine, so a gauge name must say whose it is."""
    names = [g for e in RECORDS for g in (e.queue_metric, e.running_metric, *e.kv_usage_metrics) if g]
    assert len(names) == len(set(names))


def test_the_llamacpp_adapter_reads_its_in_flight_gauges_from_the_record() -> None:
    """The drain's in-flight probe sums the record's running and queued gauges."""
    rec = engines.ENGINES["llamacpp"]
    assert set(llamacpp.IN_FLIGHT_GAUGES) == {rec.running_metric, rec.queue_metric}
    body = f"{rec.running_metric} 2\n{rec.queue_metric} 3\n".encode()
    assert llamacpp.parse_metrics_in_flight(body) == 5


def test_spec_validation_reads_needs_source_and_reserved_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing the sim's record makes a model file without a source, or with its flag, refused."""
    specs.parse_manifest(_manifest(engine_args=["--prefill-tps", "100"]))
    _replace(monkeypatch, "sim", needs_source=True, reserved_flags=frozenset({"--prefill-tps"}))
    with pytest.raises(SpecError) as err:
        specs.parse_manifest(_manifest())
    assert err.value.field == "spec.source"
    with pytest.raises(SpecError) as err:
        specs.parse_manifest(_manifest(source="/m.gguf", engine_args=["--prefill-tps=100"]))
    assert err.value.field == "spec.engine_args[0]" and "set by llmgw" in err.value.reason


def test_the_agent_reads_reserved_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's own check before launch refuses what the record reserves."""
    assert base.reserved_in("sim", ["--prefill-tps", "1"]) == []
    assert base.reserved_in("llamacpp", ["--ctx-size", "1", "--port=9"]) == ["--port=9"]
    _replace(monkeypatch, "sim", reserved_flags=frozenset({"--prefill-tps"}))
    assert base.reserved_in("sim", ["--prefill-tps", "1"]) == ["--prefill-tps"]


def test_placement_reads_the_context_flags_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The context placement estimates for follows the record's flags and default."""
    assert needs.context_tokens("llamacpp", ()) == 4096
    assert needs.context_tokens("llamacpp", ("--ctx-size", "8192")) == 8192
    assert needs.context_tokens("llamacpp", ("-c=2048",)) == 2048
    assert needs.context_tokens("vllm", ("--max-model-len", "1000")) == 1000
    assert needs.context_tokens("vllm", ()) == 0
    assert needs.context_tokens("sim", ("--window", "77")) == 0
    _replace(monkeypatch, "sim", context_flags=("--window",), context_default=1234)
    assert needs.context_tokens("sim", ("--window", "77")) == 77
    assert needs.context_tokens("sim", ()) == 1234


def test_the_router_asks_for_progress_by_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill progress is asked of an engine whose record says it reports it, and of no other."""
    req = request.parse(b'{"model":"m","stream":true,"messages":[]}')
    assert request.wants_progress(req, "llamacpp") and not request.wants_progress(req, "sim")
    assert not request.wants_progress(req, "")
    _replace(monkeypatch, "sim", reports_prefill_progress=True)
    _replace(monkeypatch, "llamacpp", reports_prefill_progress=False)
    assert request.wants_progress(req, "sim") and not request.wants_progress(req, "llamacpp")


def test_the_router_shapes_answers_by_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an engine whose record says its answers need splicing gets a shaping plan."""
    doc = {"model": "m", "messages": [], "stream": True}
    assert openai_shape.plan("llamacpp", openai_shape.CHAT_PATH, doc) is not None
    assert openai_shape.plan("sim", openai_shape.CHAT_PATH, doc) is None
    _replace(monkeypatch, "sim", openai_shapes_needed=True)
    _replace(monkeypatch, "llamacpp", openai_shapes_needed=False)
    assert openai_shape.plan("sim", openai_shape.CHAT_PATH, doc) is not None
    assert openai_shape.plan("llamacpp", openai_shape.CHAT_PATH, doc) is None


def test_the_router_holds_followers_back_by_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix wait is skipped on an engine whose cached prefix is not shared, and only there."""
    assert prefix.exclusive_prefix("llamacpp")
    assert not any(prefix.exclusive_prefix(e) for e in ("sim", "vllm", "sglang", ""))
    _replace(monkeypatch, "sim", prefix_cache_shared=False)
    _replace(monkeypatch, "llamacpp", prefix_cache_shared=True)
    assert prefix.exclusive_prefix("sim") and not prefix.exclusive_prefix("llamacpp")


def test_the_router_reads_load_gauges_from_the_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each engine's queue and running gauges are read; a record's new name is read, its old one not."""
    for record in RECORDS:
        text = f"# TYPE x gauge\n{record.queue_metric}{{a=\"b c\"}} 3\n{record.running_metric} 2\n"
        load = loadwatch.engine_load(loadwatch.parse_gauges(text))
        assert (load.waiting, load.running) == (3.0, 2.0), record.name
    vllm = loadwatch.engine_load(loadwatch.parse_gauges("vllm:gpu_cache_usage_perc 0.5\n"))
    assert vllm.kv_cache_usage == 0.5
    _replace(monkeypatch, "sim", queue_metric="test_engine_queued", running_metric="test_engine_running")
    old = loadwatch.engine_load(loadwatch.parse_gauges("llmgw_sim_requests_waiting 4\n"))
    new = loadwatch.engine_load(loadwatch.parse_gauges("test_engine_queued 4\ntest_engine_running 1\n"))
    assert old.waiting == 0.0 and (new.waiting, new.running) == (4.0, 1.0)


@pytest.mark.parametrize(("name", "fixture"), [("vllm", "vllm-0.32.0"), ("sglang", "sglang-0.5.23")])
def test_reserved_flags_are_the_engines_own(name: str, fixture: str) -> None:
    """Every reserved and context flag is one the engine's recorded parser has (a typo would reserve nothing),
    and no other flag of it is a prefix of a reserved one (the abbreviation rule would refuse it wrongly)."""
    from llmgw.testing import argcheck

    parser = argcheck.load_fixture(fixture)
    known = {o for a in parser["actions"] for o in a["option_strings"]}
    record = engines.ENGINES[name]
    assert record.reserved_flags <= known, sorted(record.reserved_flags - known)
    assert set(record.context_flags) <= known
    assert record.takes_abbreviations == parser["allow_abbrev"]
    assert all(engines.reserved_in(name, [flag]) == [] for flag in known - record.reserved_flags), \
        [f for f in known - record.reserved_flags if engines.reserved_in(name, [f])]


def test_whether_a_model_embeds_is_read_from_its_engine_and_args() -> None:
    """llama.cpp embeds only when its args turn it on (either spelling, before or after other flags); the sim
    always; vLLM and SGLang by their weights, which a spec does not say (None); an unknown engine: None."""
    assert engines.embeds("llamacpp", ["--ctx-size", "8192"]) is False
    assert engines.embeds("llamacpp", ["--ctx-size", "8192", "--embeddings", "--pooling", "mean"]) is True
    assert engines.embeds("llamacpp", ["--embedding"]) is True
    assert engines.embeds("sim", []) is True
    assert engines.embeds("vllm", ["--runner", "pooling"]) is None and engines.embeds("sglang", []) is None
    assert engines.embeds("nope", ["--embeddings"]) is None
    default = specs.parse_manifest(DEFAULT_MODEL).spec
    assert engines.embeds(default.engine, default.engine_args) is True  # `make up`'s model
