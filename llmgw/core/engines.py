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


_LLAMACPP = Engine(
    name="llamacpp",
    description="llama.cpp's server (llama-server, or the xllamacpp wheel) on a .gguf file",
    runnable=True,
    needs_source=True,
    reserved_flags=frozenset({"--host", "--port", "--model", "-m", "--api-key", "--alias", "-a",
                              "--threads", "-t", "--api-key-file"}),
    context_flags=("--ctx-size", "-c"),
    # llama-server's own default for --ctx-size.
    context_default=4096,
    queue_metric="llamacpp:requests_deferred",
    running_metric="llamacpp:requests_processing",
    kv_usage_metrics=(),
    reports_prefill_progress=True,
    prefix_cache_shared=False,
    openai_shapes_needed=True,
)

_SIM = Engine(
    name="sim",
    description="llmgw's simulated OpenAI-compatible engine, for tests and local runs",
    runnable=True,
    needs_source=False,
    reserved_flags=frozenset({"--host", "--port", "--model", "--api-key",
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
)

# vLLM and SGLang: what the router already reads from replicas it is pointed at. No adapter
# runs them yet, so they are not runnable and their reserved flags are left empty until one does.
_VLLM = Engine(
    name="vllm",
    description="vLLM's OpenAI-compatible server",
    runnable=False,
    needs_source=True,
    reserved_flags=frozenset(),
    context_flags=("--max-model-len",),
    context_default=0,
    queue_metric="vllm:num_requests_waiting",
    running_metric="vllm:num_requests_running",
    kv_usage_metrics=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    reports_prefill_progress=False,
    prefix_cache_shared=True,
    openai_shapes_needed=False,
)

_SGLANG = Engine(
    name="sglang",
    description="SGLang's OpenAI-compatible server",
    runnable=False,
    needs_source=True,
    reserved_flags=frozenset(),
    context_flags=("--context-length",),
    context_default=0,
    queue_metric="sglang:num_queue_reqs",
    running_metric="sglang:num_running_reqs",
    kv_usage_metrics=(),
    reports_prefill_progress=False,
    prefix_cache_shared=True,
    openai_shapes_needed=False,
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
