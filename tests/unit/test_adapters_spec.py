"""``spec.adapters``: parsed and refused by field, round-tripped, out of the fingerprint but for the limits,
and turned into vLLM 0.32's LoRA flags (parsed with its recorded parser) by the control plane's shard spec."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmgw.control.reconcile.shardspec import shard_spec
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core import adapters, specs
from llmgw.core.errors import SpecError
from llmgw.testing import argcheck


def doc(engine: str = "vllm", **spec: Any) -> dict[str, Any]:
    body = {"engine": engine, "source": "hf://org/base", **spec}
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "base"}, "spec": body}


TWO = [{"name": "base-sql", "source": "hf://org/sql-lora", "rank": 8}, {"name": "base-chat", "source": "/srv/chat"}]


def test_adapters_parse_and_round_trip() -> None:
    model = specs.parse_manifest(doc(adapters=TWO))
    assert model.spec.adapters == (adapters.Adapter("base-sql", "hf://org/sql-lora", 8),
                                   adapters.Adapter("base-chat", "file:///srv/chat", 0))
    assert specs.parse_manifest(model.to_manifest()) == model
    assert "adapters" not in specs.parse_manifest(doc()).to_manifest()["spec"]


@pytest.mark.parametrize(("adapters_doc", "field", "words"), [
    ("x", "spec.adapters", "expected a list"),
    ([{"name": "Bad Name", "source": "/srv/a"}], "spec.adapters[0].name", "not a valid name"),
    ([{"name": "base", "source": "/srv/a"}], "spec.adapters[0].name", "already a name of this model"),
    ([{"name": "a", "source": "/srv/a"}, {"name": "a", "source": "/srv/b"}], "spec.adapters[1].name", "already"),
    ([{"name": "a", "source": "ftp://x"}], "spec.adapters[0].source", "unsupported source"),
    ([{"name": "a", "source": "/proc/self"}], "spec.adapters[0].source", ""),
    ([{"name": "a", "source": "/srv/a", "rank": 1024}], "spec.adapters[0].rank", "between 0 and 512"),
    ([{"name": "a", "source": "/srv/a", "scale": 1}], "spec.adapters[0].scale", "unknown field"),
])
def test_bad_adapters_are_named(adapters_doc: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(adapters=adapters_doc))
    assert e.value.field == field and words in e.value.reason


@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_engines_llmgw_cannot_load_adapters_into_are_refused_with_why(engine: str) -> None:
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(engine, adapters=TWO))
    assert e.value.field == "spec.adapters" and "use engine vllm" in e.value.reason


def test_lora_flags_by_hand_are_refused_beside_adapters() -> None:
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(adapters=TWO, engine_args=["--max-lora-rank=64"]))
    assert e.value.field == "spec.engine_args[0]" and "spec.adapters" in e.value.reason
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(adapters=TWO, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}))
    assert e.value.field == "spec.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    # Without adapters the flags are the operator's own, as before.
    assert specs.parse_manifest(doc(engine_args=["--enable-lora"])).spec.engine_args == ("--enable-lora",)


def test_fingerprint_keeps_the_limits_not_the_list() -> None:
    """Adding an adapter within the limits restarts nothing; a rank past --max-lora-rank, or the first, rolls."""
    plain = specs.parse_manifest(doc()).spec
    one = specs.parse_manifest(doc(adapters=TWO[1:])).spec
    two = specs.parse_manifest(doc(adapters=TWO)).spec
    big = specs.parse_manifest(doc(adapters=[*TWO, {"name": "big", "source": "/srv/big", "rank": 64}])).spec
    assert one.fingerprint() == two.fingerprint()
    assert plain.fingerprint() != one.fingerprint()  # the engine must be started with LoRA on
    assert big.fingerprint() != two.fingerprint()
    # A model without adapters keeps the fingerprint it had before the field existed.
    assert plain.fingerprint() == dataclasses.replace(plain, adapters=()).fingerprint()


@pytest.mark.parametrize(("ranks", "count", "limits"), [
    ([8], 1, adapters.LoraLimits(8, 4, 4)),
    ([0], 2, adapters.LoraLimits(16, 4, 4)),
    ([17], 5, adapters.LoraLimits(32, 8, 8)),
    ([300], 1, adapters.LoraLimits(320, 4, 4)),
    ([8], 16, adapters.LoraLimits(8, 16, 16)),
    # More than one engine holds: at most MAX_SLOTS, the others loaded on demand (``core.adapteraffinity``).
    ([8], 17, adapters.LoraLimits(8, 16, 16)),
    ([8], adapters.MAX_ADAPTERS, adapters.LoraLimits(8, adapters.MAX_SLOTS, adapters.MAX_SLOTS)),
])
def test_limits(ranks: list[int], count: int, limits: adapters.LoraLimits) -> None:
    listed = tuple(adapters.Adapter(f"a{i}", "/srv/a", ranks[i % len(ranks)]) for i in range(count))
    assert adapters.lora_limits(listed) == limits
    assert limits.max_rank in adapters.VLLM_RANKS


def test_shard_spec_starts_vllm_with_lora_and_runtime_updating() -> None:
    model = specs.parse_manifest(doc(adapters=TWO, engine_args=["--seed", "1"], env={"VLLM_LOGGING_LEVEL": "INFO"}))
    record = ReplicaRecord(id="base-1", model="base", fingerprint="f", phase=Phase.STARTING, shard_id="base-1-s",
                           api_key="k")
    got = shard_spec(record, model.spec)
    assert dict(got.env) == {"VLLM_LOGGING_LEVEL": "INFO", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    parsed = argcheck.parse_with_fixture("vllm-0.32.0", ["--model", "/m", *got.args])
    assert (parsed["enable_lora"], parsed["max_lora_rank"], parsed["max_loras"], parsed["max_cpu_loras"]) == \
        (True, 16, 4, 4)
    assert parsed["seed"] == 1
    plain = shard_spec(record, specs.parse_manifest(doc()).spec)
    assert plain.args == () and plain.env == ()


def test_adapter_names_are_unique_across_the_cluster() -> None:
    listed = (adapters.Adapter("sql", "/srv/sql"),)
    others = [("other", "other-8b", ("o",), (adapters.Adapter("chat", "/srv/chat"),))]
    adapters.check_unique("base", "base", (), listed, others)  # no clash
    adapters.check_unique("base", "base", (), (adapters.Adapter("chat", "/x"),), [("base", "base", (), ())])  # itself
    for taken in ("other", "other-8b", "o", "chat"):
        with pytest.raises(SpecError) as e:
            adapters.check_unique("base", "base", (), (adapters.Adapter(taken, "/x"),), others)
        assert e.value.field == "spec.adapters[0].name" and "model other" in e.value.reason
    with pytest.raises(SpecError) as e:
        adapters.check_unique("chat", "chat", (), (), others)
    assert "adapter of model other" in e.value.reason
