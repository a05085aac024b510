"""The tiny random-weight llama model for tests of real engines (``write_tiny_llama_gguf``).

It lives in shipped code (``llmgw.agent.provision.tinygguf``), where the agent's engine probe writes
it too; tests import it from here, with its dimensions, to compare what a scan or an engine reports.
"""

from __future__ import annotations

from llmgw.agent.provision.tinygguf import (
    N_CTX,
    N_EMBD,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    N_LAYER,
    SEED,
    vocabulary,
    write_tiny_llama_gguf,
)

__all__ = ["N_CTX", "N_EMBD", "N_FF", "N_HEAD", "N_HEAD_KV", "N_LAYER", "SEED", "vocabulary",
           "write_tiny_llama_gguf"]
