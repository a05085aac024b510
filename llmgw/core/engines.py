"""Facts about engines that both the control plane and the agent need.

The control plane refuses a model file whose engine args set a flag llmgw sets
itself, at apply time, rather than letting the agent find out minutes later.
"""

from __future__ import annotations

#: Engines this version can run, and what each needs.
KNOWN_ENGINES: dict[str, str] = {
    "llamacpp": "llama.cpp's server (llama-server, or the xllamacpp wheel) on a .gguf file",
    "sim": "llmgw's simulated OpenAI-compatible engine, for tests and local runs",
}

#: Engines that load weights and so need ``spec.source``.
NEEDS_SOURCE = frozenset({"llamacpp"})

#: Flags llmgw sets for each engine; engine_args may not set them again.
RESERVED_FLAGS: dict[str, frozenset[str]] = {
    "llamacpp": frozenset({"--host", "--port", "--model", "-m", "--api-key", "--alias", "-a",
                           "--threads", "-t", "--api-key-file"}),
    "sim": frozenset({"--host", "--port", "--model", "--api-key",
                      "--nnodes", "--rank", "--leader-addr", "--leader-port"}),
}
