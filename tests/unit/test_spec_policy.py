"""The spec policy on plain data (issue 24): a model's env by allowlist, code-loading engine flags refused.

Every name the attacker used is refused with the sentence, whatever the engine and whatever an admin
allowed; each engine's documented knobs pass; a name an admin adds passes; the code flags are refused
in each spelling the engine's parser takes (``=``, underscores, abbreviations) unless remote code is
allowed; and the flag lists agree with the engines' own parsers (the fixtures in
llmgw/testing/engineflags).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

from llmgw.agent.supervisor import launching
from llmgw.control.store import settings as settings_store
from llmgw.core import engines, envpolicy, flagpolicy, specpolicy, specs
from llmgw.core.errors import SpecError
from llmgw.core.shards import ShardSpec
from llmgw.testing.argcheck import FIXTURES

#: What issue 24 found let through, each refused for every engine and whatever an admin allowed.
ATTACKER_NAMES = ("OPENSSL_CONF", "OPENSSL_MODULES", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
                  "TRITON_PTXAS_PATH", "SSLKEYLOGFILE", "HOME", "LD_PRELOAD", "PYTHONPATH", "PATH",
                  # every engine's key variable, for its own engine and the others
                  "VLLM_API_KEY", "LLAMA_API_KEY", "LLMGW_SIM_API_KEY",
                  # path variables inside allowed prefixes
                  "HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "CUDA_HOME", "CUDA_CACHE_PATH",
                  "CUDA_INJECTION64_PATH", "TORCH_HOME", "TORCH_EXTENSIONS_DIR", "NCCL_CONF_FILE", "NCCL_TOPO_FILE",
                  "NCCL_DEBUG_FILE", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_LOGGING_CONFIG_PATH",
                  "VLLM_NCCL_SO_PATH", "VLLM_RPC_BASE_PATH", "VLLM_TORCH_PROFILER_DIR", "VLLM_ALLOWED_LOCAL_MEDIA_PATH",
                  "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_LOGGING_STREAM", "VLLM_SERVER_DEV_MODE",
                  "SGLANG_EXTERNAL_MODEL_PACKAGE", "SGLANG_TORCH_PROFILER_DIR", "GGML_BACKEND_PATH", "LLAMA_CACHE",
                  "LLAMA_ARG_MMPROJ", "TMPDIR", "LLMGW_RUN_DIR", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE",
                  "HF_ENDPOINT",
                  # found by the end-to-end attack test: paths by another name, credentials, users' completions
                  "TORCH_TRACE", "CUDA_COREDUMP_PIPE", "SGLANG_API_KEY", "HF_TOKEN",
                  "VLLM_DEBUG_LOG_API_SERVER_RESPONSE")
ENGINES = ("vllm", "sglang", "llamacpp", "sim")
#: Knobs each engine documents, accepted with no admin setting.
DOCUMENTED = {
    "vllm": ("VLLM_ATTENTION_BACKEND", "VLLM_USE_V1", "VLLM_PLUGINS", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME",
             "NCCL_IB_GID_INDEX", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "HF_HUB_DISABLE_TELEMETRY", "TOKENIZERS_PARALLELISM", "TORCH_CUDA_ARCH_LIST", "PYTORCH_CUDA_ALLOC_CONF",
             "TRANSFORMERS_VERBOSITY", "GLOO_SOCKET_IFNAME", "PYTHONUNBUFFERED"),
    "sglang": ("SGLANG_ENABLE_JIT_DEEPGEMM", "SGL_ENABLE_JIT_DEEPGEMM", "NCCL_DEBUG", "CUDA_LAUNCH_BLOCKING",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING", "HF_HUB_DISABLE_PROGRESS_BARS"),
    "llamacpp": ("LLAMA_LOG_VERBOSITY", "GGML_CUDA_ENABLE_UNIFIED_MEMORY", "OMP_NUM_THREADS", "CUDA_LAUNCH_BLOCKING"),
    "sim": ("OMP_NUM_THREADS", "PYTHONUNBUFFERED"),
}
#: Flags that run or load code, per engine, each refused in several spellings.
CODE_FLAGS = {
    "vllm": ["--trust-remote-code", "--trust_remote_code", "--trust-remote-code=true", "--trust-remote",
             "--trust-rem", "--tool-parser-plugin=/w/p.py", "--worker-cls", "--worker-extension-cls", "--middleware",
             "--logits-processors", "--reasoning-parser-plugin", "--chat-template", "--config", "--kv-transfer-config",
             "--allowed-local-media-path", "--log-config-file", "--scheduler-cls", "--io-processor-plugin"],
    "sglang": ["--trust-remote-code", "--trust-remote", "--enable-custom-logit-processor", "--enable-custom-logit",
               "--custom-weight-loader", "--forward-hooks", "--chat-template", "--lora-paths"],
    "llamacpp": ["--lora", "--mmproj", "-mu", "--model-url", "--chat-template-file", "--slot-save-path", "--path",
                 "--rpc", "-hf", "--log-file"],
}
#: Everyday flags that must stay accepted.
SAFE_ARGS = {
    "vllm": ["--max-model-len", "2048", "--enable-prefix-caching", "--max-num-seqs", "8", "--enforce-eager",
             "--reasoning-parser", "qwen3", "--chat-template-content-format", "openai", "--generation-config", "vllm",
             "--no-trust-remote-code", "--hf-overrides", "{\"max_position_embeddings\": 4096}",
             "--quantization", "fp8"],
    "sglang": ["--context-length", "4096", "--quantization", "fp8", "--export-metrics-to-file",
               "--hicache-storage-backend", "file", "--json-model-override-args", "{}"],
    "llamacpp": ["--ctx-size", "4096", "--chat-template", "chatml", "--parallel", "2", "--jinja", "-p", "x"],
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ATTACKER_NAMES)
def test_attacker_names_are_refused_for_every_engine_even_when_an_admin_lists_them(engine: str, name: str) -> None:
    """Each name is refused with its reason; an admin's allowed_env cannot let it through, nor may an admin add it."""
    why = envpolicy.refusal(engine, name, allowed_env=frozenset({name}))
    assert why is not None and name in why, why
    assert any(s in why for s in ("load or run other code", "names a file, a directory or code", "set by llmgw",
                                  "API key", "engine_args", "offline", "credential")), why
    assert envpolicy.allowed_env_refusal(name) is not None
    assert launching.shards.env_refusal(name) is not None  # what the agent drops at launch


@pytest.mark.parametrize(("engine", "name"), [(e, n) for e, names in DOCUMENTED.items() for n in names])
def test_documented_knobs_are_accepted(engine: str, name: str) -> None:
    """The knobs each engine documents pass with no admin setting."""
    assert envpolicy.refusal(engine, name) is None


@pytest.mark.parametrize(("engine", "name"), [("vllm", "SGLANG_ENABLE_JIT_DEEPGEMM"), ("sglang", "VLLM_USE_V1"),
                                              ("llamacpp", "VLLM_USE_V1"), ("llamacpp", "HF_DEBUG"),
                                              ("sim", "NCCL_DEBUG"), ("vllm", "FOO_BAR"),
                                              ("vllm", "NVIDIA_TF32_OVERRIDE"), ("vllm", "HTTP_PROXY")])
def test_other_names_need_an_admin_and_say_how(engine: str, name: str) -> None:
    """Another engine's knob or an unknown name: refused naming the rule and the command; accepted once listed."""
    why = envpolicy.refusal(engine, name)
    assert why is not None
    assert why.startswith(f"not an engine setting llmgw allows ({engine} takes ")
    assert why.endswith(f"an admin may allow it with `llmgw settings set allowed_env+={name}`")
    assert envpolicy.refusal(engine, name, allowed_env=frozenset({name})) is None
    assert envpolicy.allowed_env_refusal(name) is None


def _model(engine: str, **spec: Any) -> specs.Model:
    source = {} if engine == "sim" else {"source": "hf://org/repo"}
    return specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                                 "spec": {"engine": engine, **source, **spec}})


def test_apply_check_names_the_field_and_the_sentence() -> None:
    """``specpolicy.check`` refuses spec.env.NAME with the allowlist sentence and accepts it with the admin's name."""
    model = _model("vllm", env={"FOO_BAR": "1", "VLLM_USE_V1": "1"})
    with pytest.raises(SpecError) as e:
        specpolicy.check(model.spec)
    assert e.value.field == "spec.env.FOO_BAR"
    assert str(e.value) == ("spec.env.FOO_BAR: not an engine setting llmgw allows (vllm takes VLLM_*, NCCL_*, CUDA_*, "
                            "OMP_*, MKL_*, KMP_*, HF_*, TOKENIZERS_*, TORCH_*, PYTORCH_*, TRANSFORMERS_*, GLOO_*, "
                            "PYTHONDONTWRITEBYTECODE, PYTHONFAULTHANDLER, PYTHONHASHSEED, PYTHONIOENCODING, "
                            "PYTHONMALLOC, PYTHONUNBUFFERED); an admin may allow it with "
                            "`llmgw settings set allowed_env+=FOO_BAR`")
    specpolicy.check(model.spec, allowed_env=["FOO_BAR"])


@pytest.mark.parametrize("name", ["OPENSSL_CONF", "NCCL_NET_PLUGIN", "SSLKEYLOGFILE", "HOME", "VLLM_API_KEY"])
def test_parse_refuses_never_allowed_names_but_a_stored_model_still_loads(name: str) -> None:
    """The CLI and the server refuse them while parsing; a model stored before the rule reads back."""
    with pytest.raises(SpecError) as e:
        _model("vllm", env={name: "/w/x"})
    assert e.value.field == f"spec.env.{name}" and name in str(e.value)
    doc = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
           "spec": {"engine": "vllm", "source": "hf://org/repo", "env": {name: "/w/x"}}}
    assert specs.parse_manifest(doc, stored=True).spec.env == ((name, "/w/x"),)


def test_the_agent_drops_never_allowed_names_at_launch(tmp_path: Path) -> None:
    """A stored spec's OPENSSL_CONF or NCCL_NET_PLUGIN never reaches the engine; a documented knob does."""
    from llmgw.agent import engines as agent_engines

    class Adapter:
        name, health_path = "vllm", "/health"

        def launch(self, spec: ShardSpec, **_: Any) -> agent_engines.Launch:
            return agent_engines.Launch(argv=[sys.executable, "-c", "pass"], env={}, serves_http=True, cwd="")

    spec = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="vllm", served_name="m", port=8011,
                     env=(("NCCL_DEBUG", "INFO"), ("NCCL_NET_PLUGIN", "/w/evil.so"), ("OPENSSL_CONF", "/w/evil.cnf"),
                          ("SSLKEYLOGFILE", "/w/keys")))
    p = launching.plan(spec, Adapter(), host="127.0.0.1", model_path=None, cpu_count=2, run_dir=tmp_path)
    assert p.env["NCCL_DEBUG"] == "INFO"
    for name in ("NCCL_NET_PLUGIN", "OPENSSL_CONF", "SSLKEYLOGFILE"):
        assert p.env.get(name) != spec_value(spec, name)


def spec_value(spec: ShardSpec, name: str) -> str:
    return dict(spec.env)[name]


@pytest.mark.parametrize(("engine", "arg"), [(e, a) for e, args in CODE_FLAGS.items() for a in args])
def test_code_flags_are_refused_in_every_spelling_unless_remote_code_is_allowed(engine: str, arg: str) -> None:
    """The flag itself, ``=value``, underscores and an abbreviation argparse would take: refused with the sentence."""
    got = flagpolicy.refusals(engine, ["--x", arg] if engine != "llamacpp" else [arg])
    assert len(got) == 1, got
    index, why = got[0]
    assert arg.split("=", 1)[0] in why
    assert why.endswith("llmgw refuses it; an admin may allow it for the whole cluster with "
                        "`llmgw settings set allow_remote_code true`")
    assert flagpolicy.refusals(engine, [arg], allow_remote_code=True) == []


@pytest.mark.parametrize("engine", list(SAFE_ARGS))
def test_everyday_flags_are_accepted(engine: str) -> None:
    """Context, batching, parsers, quantization and the like pass; so does --generation-config vllm."""
    assert flagpolicy.refusals(engine, SAFE_ARGS[engine]) == []


def test_generation_config_names_a_path_only_past_auto_and_vllm() -> None:
    """``--generation-config /dir`` reads a directory; ``vllm`` and ``auto`` name none."""
    assert flagpolicy.refusals("vllm", ["--generation-config", "/w/dir"])
    assert flagpolicy.refusals("vllm", ["--generation-config=/w/dir"])
    assert flagpolicy.refusals("vllm", ["--generation-config=auto"]) == []


def test_llamacpp_takes_no_abbreviations_so_only_whole_flags_count() -> None:
    """llama-server's parser matches flags exactly: ``--lor`` is not ``--lora`` there."""
    assert flagpolicy.refusals("llamacpp", ["--lor", "x"]) == []


def test_remote_code_on_a_vllm_model_is_refused_at_apply_and_allowed_by_the_setting() -> None:
    """``engine_args: ["--trust-remote-code"]``: spec.engine_args[0] and the sentence; accepted when allowed."""
    model = _model("vllm", engine_args=["--max-model-len", "2048", "--trust-remote-code"])
    with pytest.raises(SpecError) as e:
        specpolicy.check(model.spec)
    assert e.value.field == "spec.engine_args[2]"
    assert "--trust-remote-code makes vllm run or load code" in str(e.value)
    specpolicy.check(model.spec, allow_remote_code=True)


@pytest.mark.parametrize("fixture", ["vllm-0.32.0", "sglang-0.5.23"])
def test_the_flag_lists_agree_with_the_engines_own_parsers(fixture: str) -> None:
    """Every code flag exists in the engine's parser, and no flag of the parser that abbreviates one is left out."""
    doc = json.loads((FIXTURES / f"{fixture}.json").read_text())
    rec = engines.ENGINES[doc["engine"]]
    flags = {o for a in doc["actions"] for o in a["option_strings"]}
    assert rec.code_flags <= flags, sorted(rec.code_flags - flags)
    prefixes = {f for f in flags if f.startswith("--") and f not in rec.code_flags
                and any(c.startswith(f) for c in rec.code_flags)}
    assert prefixes == set(rec.safe_prefix_flags)


def test_the_settings_document_refuses_what_no_admin_may_allow() -> None:
    """allowed_env takes names the rule allows, sorted and unique; LD_PRELOAD or a bad name is refused."""
    doc = settings_store.ClusterSettings(allowed_env=["FOO_BAR", "NVIDIA_TF32_OVERRIDE", "FOO_BAR"])
    assert doc.allowed_env == ["FOO_BAR", "NVIDIA_TF32_OVERRIDE"]
    for bad in ("LD_PRELOAD", "OPENSSL_CONF", "1BAD", "A-B"):
        with pytest.raises(pydantic.ValidationError):
            settings_store.ClusterSettings(allowed_env=[bad])
    with pytest.raises(pydantic.ValidationError):
        settings_store.SettingsChange(allow_remote_code="yes")  # type: ignore[arg-type]


def test_the_cli_turns_set_into_the_put_body() -> None:
    """``set KEY VALUE``, ``allowed_env+=NAME`` and ``-=NAME`` become the keys to PUT; a bad value says the usage."""
    from llmgw.cli import settings as cli_settings
    from llmgw.core.errors import LlmgwError

    have = {"allowed_env": ["A_B"], "allow_remote_code": False}
    assert cli_settings.change(have, "allow_remote_code", "true") == {"allow_remote_code": True}
    assert cli_settings.change(have, "allowed_env+=FOO_BAR,A_B", None) == {"allowed_env": ["A_B", "FOO_BAR"]}
    assert cli_settings.change(have, "allowed_env-=A_B", None) == {"allowed_env": []}
    assert cli_settings.change(have, "allowed_env", "") == {"allowed_env": []}
    for key, value in (("allow_remote_code", "maybe"), ("nope", "1"), ("allowed_env", None)):
        with pytest.raises(LlmgwError):
            cli_settings.change(have, key, value)
