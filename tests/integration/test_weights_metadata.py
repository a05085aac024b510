"""Weights metadata from a real agent reaches the control plane, and an engine's version can be matched."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from llmgw.core import estimate
from llmgw.core.inventory import WeightFile
from llmgw.testing import tiny_gguf
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = pytest.mark.slow


def test_a_registered_node_reports_what_its_gguf_header_says(tmp_path: Path) -> None:
    """A .gguf in the agent's weights directory arrives over gRPC with its shape; versions are the packages'."""
    s = System(tmp_path)
    try:
        # The agent's default weights directory (``--state-dir``/weights), filled before it starts.
        (tmp_path / "node1" / "weights").mkdir(parents=True)
        path = tiny_gguf.write_tiny_llama_gguf(tmp_path / "node1" / "weights" / "tiny.gguf")
        s.start_server()
        s.start_agent("node1")
        node = wait_for(lambda: next((n for n in s.get("/api/v1/nodes")["items"]
                                      if n["id"] == "node1" and n["weights"]), None), timeout=30, what="weights")
        assert isinstance(node, dict)
        (w,) = node["weights"]
        assert (w["path"], w["format"], w["size_bytes"]) == (str(path), "gguf", path.stat().st_size)
        assert (w["layers"], w["heads"], w["kv_heads"], w["head_dim"], w["context_length"]) == (
            tiny_gguf.N_LAYER, tiny_gguf.N_HEAD, tiny_gguf.N_HEAD_KV, tiny_gguf.N_EMBD // tiny_gguf.N_HEAD,
            tiny_gguf.N_CTX)
        assert w["params"] > 0
        # What the control plane holds is enough for an estimate.
        assert estimate.memory_bytes(WeightFile(**w), 0) is not None
        engines = {e["name"]: e["version"] for e in node["engines"]}
        assert engines["sim"] == importlib.metadata.version("llmgw")
        assert engines["llamacpp"] == importlib.metadata.version("xllamacpp")
    finally:
        s.close()
