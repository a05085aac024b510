"""llama.cpp's adapters: accepted at apply, in the fingerprint (llama.cpp takes them only at start) and not
for vLLM, started as ``--lora FILE ... --lora-init-without-apply`` (at scale 0 in the launcher's params), and
routed by adding llama.cpp's ``lora`` field (the adapter's index, the scale asked) and the prompt cache off."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from llmgw.agent.engines import llamacpp
from llmgw.api import routing
from llmgw.control.reconcile.shardspec import shard_spec
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core import shards, specs
from llmgw.router import errors, loraroute, request
from llmgw.router.table import RouteTable

TWO = [{"name": "sql", "source": "/srv/sql.gguf"}, {"name": "chat", "source": "/srv/chat.gguf"}]


def doc(engine: str = "llamacpp", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "base"},
            "spec": {"engine": engine, "source": "/srv/base.gguf", **spec}}


def test_llamacpp_adapters_are_accepted_and_their_list_is_in_the_fingerprint() -> None:
    one = specs.parse_manifest(doc(adapters=TWO[:1])).spec
    two = specs.parse_manifest(doc(adapters=TWO)).spec
    plain = specs.parse_manifest(doc()).spec
    assert len({one.fingerprint(), two.fingerprint(), plain.fingerprint()}) == 3  # a change restarts llama.cpp
    vllm_one = specs.parse_manifest(doc("vllm", adapters=TWO[:1])).spec
    assert vllm_one.fingerprint() == specs.parse_manifest(doc("vllm", adapters=TWO)).spec.fingerprint()
    record = ReplicaRecord(id="base-1", model="base", fingerprint="f", phase=Phase.STARTING, shard_id="s", api_key="k")
    got = shard_spec(record, two)
    assert got.args == () and got.env == () and [a.name for a in got.adapters] == ["sql", "chat"]


def test_the_launch_names_each_file_in_order_at_scale_zero() -> None:
    import xllamacpp

    from llmgw.agent.engines import llamacpp_launcher as launcher

    spec = shards.ShardSpec(shard_id="s1", replica_id="r1", model="b", engine="llamacpp", served_name="base",
                            source="file:///m.gguf", args=("--ctx-size", "512"))
    argv = llamacpp.LlamaCpp(which=lambda _: None).launch(
        spec, host="127.0.0.1", port=1, model_path="/m.gguf", cpu_count=2, python="/py",
        lora_paths=("/a/sql.gguf", "/a/chat.gguf")).argv
    assert argv[argv.index("--lora"):] == ["--lora", "/a/sql.gguf", "--lora", "/a/chat.gguf",
                                           "--lora-init-without-apply", "--ctx-size", "512"]
    params = launcher.build_params(launcher.parse_args(argv[3:]), xllamacpp)
    assert [(a.path, a.scale) for a in params.lora_adapters] == [("/a/sql.gguf", 0.0), ("/a/chat.gguf", 0.0)]
    plain = llamacpp.LlamaCpp(which=lambda _: None).launch(spec, host="h", port=1, model_path="/m.gguf",
                                                           cpu_count=2, python="/py").argv
    assert not any(a.startswith("--lora") for a in plain)
    missing = launcher.check_model("/nonexistent.gguf", "LoRA adapter")
    assert missing == "LoRA adapter file /nonexistent.gguf does not exist"


def routes(engine: str, held: tuple[str, ...] = ("sql", "chat")) -> RouteTable:
    a = routing.EndpointDoc("r1", "http://127.0.0.1:1", adapters=held)
    entry = routing.ModelEntry(name="base", served_name="base", endpoints=(a,), adapters=("sql", "chat"), engine=engine)
    plain = routing.ModelEntry(name="plain", served_name="plain", endpoints=(a,), engine=engine)
    return RouteTable.from_doc(routing.EndpointsDoc(models=(entry, plain)).to_doc())


def sent(t: RouteTable, body: dict[str, Any]) -> dict[str, Any]:
    route = t.lookup(body["model"])
    assert route is not None
    req = request.parse(json.dumps(body).encode())
    out = request.for_engine(req, route.served_name)
    if route.lora is not None:
        out = loraroute.apply(route.lora, req, out)
    return dict(json.loads(out))


def test_a_llamacpp_adapter_request_names_its_id_and_scale_and_the_cache_is_off() -> None:
    t = routes("llamacpp")
    assert sent(t, {"model": "chat", "messages": []}) == {"lora": [{"id": 1, "scale": 1.0}], "cache_prompt": False,
                                                          "model": "chat", "messages": []}
    got = sent(t, {"model": "sql", "lora_scale": 0.25})
    assert got["lora"] == [{"id": 0, "scale": 0.25}] and got["cache_prompt"] is False
    assert sent(t, {"model": "base"}) == {"cache_prompt": False, "model": "base"}
    plain = t.lookup("plain")
    assert plain is not None and plain.lora is None  # no adapters: nothing added, nothing asked
    # An engine started with another list (a rollout) is not sent an id it would read as another adapter.
    swapped = routes("llamacpp", held=("chat", "sql"))
    sql = swapped.lookup("sql")
    # None holds it at id 0: held as a cold start until a replica started with this list is Ready, never sent to
    # an engine that would read id 0 as "chat".
    assert sql is not None and sql.endpoints == () and "not loaded into any replica" in sql.message


@pytest.mark.parametrize(("engine", "model", "scale", "words"), [
    ("llamacpp", "sql", 5, "from 0 (the base model's answer) to 4"),
    ("llamacpp", "sql", True, "must be a number"),
    ("llamacpp", "sql", "1", "must be a number"),
    ("llamacpp", "base", 0.5, "ask for the adapter by name"),
    ("vllm", "sql", 0.5, "only llama.cpp models take a scale"),
])
def test_a_scale_that_cannot_apply_is_refused_naming_the_field(engine: str, model: str, scale: object,
                                                               words: str) -> None:
    with pytest.raises(errors.ApiError) as e:
        sent(routes(engine), {"model": model, "lora_scale": scale})
    assert e.value.status == 400 and e.value.param == "lora_scale" and words in e.value.message


def test_a_runtime_engines_adapter_request_is_sent_as_the_client_wrote_it() -> None:
    t = routes("vllm")
    body = json.dumps({"model": "sql", "messages": []}).encode()
    route = t.lookup("sql")
    assert route is not None and route.lora is not None
    assert loraroute.apply(route.lora, request.parse(body), body) == body
    assert t.lookup("base").lora is None  # type: ignore[union-attr]


def test_sglang_starts_with_its_adapters_named_and_each_flag_parses() -> None:
    from llmgw.agent.engines import sglang
    from llmgw.testing import argcheck

    model = specs.parse_manifest(doc("sglang", source="/srv/base", adapters=[
        {"name": "sql", "source": "/srv/sql", "rank": 32}, {"name": "chat", "source": "/srv/chat"}]))
    assert model.spec.fingerprint() != specs.parse_manifest(doc("sglang", source="/srv/base")).spec.fingerprint()
    spec = shards.ShardSpec(shard_id="s1", replica_id="r1", model="base", engine="sglang", served_name="base",
                            source="file:///srv/base", gpus=(0,), adapters=model.spec.adapters)
    argv = sglang.Sglang(python="/py").launch(spec, host="127.0.0.1", port=1, model_path="/srv/base", cpu_count=8,
                                              lora_paths=("/c/sql", "/c/chat")).argv
    parsed = argcheck.parse_with_fixture("sglang-0.5.23", argv[3:])
    assert (parsed["enable_lora"], parsed["max_lora_rank"], parsed["max_loras_per_batch"]) == (True, 32, 4)
    assert parsed["lora_paths"] == ["sql=/c/sql", "chat=/c/chat"]
    plain = sglang.Sglang(python="/py").launch(dataclasses.replace(spec, adapters=()), host="h", port=1,
                                               model_path="/srv/base", cpu_count=8).argv
    assert "--enable-lora" not in plain


def test_an_sglang_adapter_is_asked_for_as_base_colon_adapter_and_listed_by_its_name() -> None:
    t = routes("sglang")
    route = t.lookup("sql")
    assert route is not None and route.public_names() == ("sql",) and route.parent == "base"
    assert sent(t, {"model": "sql", "messages": []}) == {"model": "base:sql", "messages": []}
    assert "sql" in t.public_names() and "base:sql" not in t.public_names()
    with pytest.raises(errors.ApiError, match="only llama.cpp models take a scale"):
        sent(t, {"model": "sql", "lora_scale": 0.5})


def test_an_sglang_older_than_the_checked_one_is_refused_before_launch_with_why() -> None:
    from llmgw.agent.engines import sglang
    from llmgw.core import adapters
    from llmgw.core import errors as core_errors

    spec = shards.ShardSpec(shard_id="s1", replica_id="r1", model="base", engine="sglang", served_name="base",
                            source="file:///srv/base", gpus=(0,), adapters=(adapters.Adapter("sql", "/srv/sql"),))
    old = sglang.Sglang(python="/opt/sgl/bin/python", run=lambda argv: "0.4.10.post2\n")
    with pytest.raises(core_errors.EngineError) as e:
        old.launch(spec, host="h", port=1, model_path="/srv/base", cpu_count=8, lora_paths=("/c/sql",))
    assert "SGLang 0.4.10.post2 is older than 0.5.23" in str(e.value) and "remove the model's adapters" in str(e.value)
    # Without adapters that SGLang still runs; one as new as the checked one takes them.
    assert old.launch(dataclasses.replace(spec, adapters=()), host="h", port=1, model_path="/srv/base", cpu_count=8)
    new = sglang.Sglang(python="/opt/sgl/bin/python", run=lambda argv: "0.5.23\n")
    assert "--lora-paths" in new.launch(spec, host="h", port=1, model_path="/srv/base", cpu_count=8,
                                        lora_paths=("/c/sql",)).argv
