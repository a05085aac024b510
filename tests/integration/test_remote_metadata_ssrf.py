"""The control plane's own metadata reads (before placing) reach no loopback or link-local URL unless allowed."""

from __future__ import annotations

from pathlib import Path

from llmgw.control import remotemeta
from llmgw.testing.flakyhttp import FlakyHttp
from llmgw.testing.tiny_gguf import write_tiny_llama_gguf


def test_a_loopback_source_is_not_read_by_the_control_plane_unless_allowed(tmp_path: Path) -> None:
    """http://127.0.0.1:PORT and 169.254.169.254: the problem names the flag and no request is sent; allowed, read."""
    (tmp_path / "srv").mkdir()
    write_tiny_llama_gguf(tmp_path / "srv" / "m.gguf")
    with FlakyHttp(tmp_path / "srv") as srv:
        found = remotemeta.Reader().read(f"{srv.url}/m.gguf")
        assert found.weight is None and "is a loopback address" in found.problem, found
        assert "--fetch-allow-private HOST[:PORT] on `llmgw server`" in found.problem
        assert srv.seen == []
        metadata = remotemeta.Reader(timeout_s=2).read("http://169.254.169.254/latest/meta-data/m.gguf")
        assert metadata.weight is None and "link-local" in metadata.problem, metadata
        allowed = remotemeta.Reader(allow_private=[srv.allowed]).read(f"{srv.url}/m.gguf")
        assert allowed.weight is not None and allowed.weight.format == "gguf", allowed
        # The cluster's own mirror/hub endpoints are trusted by configuration, on loopback too.
        trusted = remotemeta.Reader(hub_endpoint=srv.url).read(f"{srv.url}/m.gguf")
        assert trusted.weight is not None
