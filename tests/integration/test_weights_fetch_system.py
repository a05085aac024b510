"""Remote weights through a real server and agent: Fetching with progress in `llmgw get replicas`, then Ready and
the weights in the node's inventory as fetched by llmgw; a wrong sha256 fails the replica with the fetcher's
sentence; the hub's token reaches the fetch and no REST document, log or state file.

The weights come from a local HTTP server that throttles (``llmgw.testing.flakyhttp``); nothing reaches the
internet. The sim engine loads nothing, but a sim model with a source still has it fetched before launch.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.flakyhttp import FlakyHttp
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, running, sim_model
from llmgw.testing.tiny_gguf import write_tiny_llama_gguf

pytestmark = pytest.mark.slow
TOKEN = "hf_systemtest_token_4f1c9a"


def allowing(srv: FlakyHttp) -> dict[str, Any]:
    """System arguments that let the agent and the control plane fetch from ``srv``, which is on loopback."""
    return {"agent_env": {"LLMGW_AGENT_FETCH_ALLOW_PRIVATE": srv.allowed},
            "server_args": ["--fetch-allow-private", srv.allowed]}


def get_replicas(s: System) -> str:
    out = subprocess.run([sys.executable, "-m", "llmgw", "get", "replicas", "--url", s.url], capture_output=True,
                         text=True, timeout=30, env={**s.cli_env(), "COLUMNS": "250"}, check=True)
    return out.stdout


def test_http_source_is_fetched_with_progress_then_ready_and_listed(tmp_path: Path) -> None:
    """`get replicas` shows `Fetching NN% ... MB/s` while the weights come; then Ready, and the node lists them."""
    files = tmp_path / "files"
    files.mkdir()
    model = write_tiny_llama_gguf(files / "tiny.gguf")
    # Padded to 8 MiB, served at 1.5 MB/s: about 5 s of download, and the fetcher counts bytes
    # a MiB at a time, so several progress reports come before it ends.
    with model.open("ab") as f:
        f.write(b"\0" * (8 * 2**20 - model.stat().st_size))
    (files / "other.gguf").write_bytes(model.read_bytes())
    with FlakyHttp(files, rate_bps=1_500_000) as srv, \
            running(tmp_path / "sys", **allowing(srv)) as s:
        source = f"{srv.url}/tiny.gguf"
        s.apply(sim_model("fetched", source=source,
                          source_sha256=hashlib.sha256(model.read_bytes()).hexdigest()))
        seen = wait_for(lambda: re.search(r"Fetching \d+% \d+ MB/s", get_replicas(s)), timeout=30, interval=0.2,
                        what="Fetching NN% in `llmgw get replicas`")
        assert seen is not None
        describe = subprocess.run([sys.executable, "-m", "llmgw", "describe", "model", "fetched", "--url", s.url],
                                  capture_output=True, text=True, timeout=30, env={**s.cli_env(), "COLUMNS": "250"},
                                  check=True).stdout
        assert re.search(r"fetching its weights: \[[#.]+\] \d+%", describe) or "Ready" in describe
        s.wait_model("fetched", timeout=60)
        assert "Fetching" not in get_replicas(s)

        def listed() -> dict[str, object] | None:
            node = next(n for n in s.get("/api/v1/nodes")["items"] if n["id"] == "node1")
            return next((w for w in node["weights"] if w["fetched_by_llmgw"] and w["source"] == source), None)

        held = wait_for(listed, timeout=30, interval=0.3, what="the fetched weights in node1's inventory")
        assert held["cache_name"] and held["last_used_unix"] > 0 and str(held["path"]).startswith(
            str(tmp_path / "sys" / "node1"))

        srv.rate_bps = None
        s.apply(sim_model("wrongsum", source=f"{srv.url}/other.gguf", source_sha256="0" * 64))

        def failed() -> str | None:
            rs = s.replicas("wrongsum")
            return next((r["message"] for r in rs if "sha256" in r["message"]), None)

        message = wait_for(failed, timeout=60, interval=0.3, what="the wrong-sha256 replica failed")
        assert f"expected {'0' * 64}" in str(message) and "other.gguf" in str(message)
        assert f"got {hashlib.sha256(model.read_bytes()).hexdigest()}" in str(message)
        # Discarded: neither in the cache nor kept as a partial download (the cache name carries "other.gguf").
        weights = tmp_path / "sys" / "node1" / "weights"
        wait_for(lambda: not [p for p in weights.rglob("*") if "other.gguf" in p.name], timeout=10, interval=0.2,
                 what="the corrupt download discarded")


def test_hub_token_reaches_the_fetch_and_nothing_a_person_reads(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The token from LLMGW_HF_TOKEN is sent to the hub by the fetch, and is in no REST answer, log or state file."""
    monkeypatch.setenv("LLMGW_HF_TOKEN", TOKEN)
    with FlakyHttp(tmp_path) as hub:
        with running(tmp_path / "sys", server_args=["--hub-endpoint", hub.url]) as s:
            s.apply(sim_model("gated", source="hf://org/gated@main"))
            wait_for(lambda: any(seen.authorized for seen in hub.seen), timeout=30, interval=0.2,
                     what="a request carrying the token at the hub")
            # The fetcher's own sentence: the agent got the StartShard with the hub's endpoint and asked it.
            wait_for(lambda: any(r["failures"] and "404" in r["message"] for r in s.replicas("gated")), timeout=60,
                     interval=0.3, what="the replica failed with the fetcher's sentence (no such repository)")
            docs = [s.request("GET", path).text for path in (
                "/api/v1/replicas", "/api/v1/models", "/api/v1/models/gated/describe", "/api/v1/nodes",
                "/api/v1/nodes/node1/describe", "/api/v1/events")]
        assert all(TOKEN not in doc for doc in docs)
        for path in (tmp_path / "sys").rglob("*"):
            if path.is_file() and path.suffix != ".db" and "-wal" not in path.name:
                assert TOKEN.encode() not in path.read_bytes(), path
