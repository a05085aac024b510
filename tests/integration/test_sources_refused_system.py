"""An operator's source cannot make a node read the control plane's CA key, or anyone fetch from loopback.

A real server and agent (mutual TLS, joined): the model naming the server's ``ca.key`` fails on the node with
the source-roots sentence and no byte of the key anywhere a viewer looks; the one naming a loopback URL fails
with the SSRF sentence, and the loopback server is never asked (neither the control plane's metadata read
nor the agent's fetch); a file under a root the agent's settings add passes the node's check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.testing.flakyhttp import FlakyHttp, write_file
from llmgw.testing.procs import wait_for
from llmgw.testing.system import running, sim_model

pytestmark = pytest.mark.slow


def test_ca_key_and_loopback_sources_are_refused_and_a_rooted_file_runs(tmp_path: Path) -> None:
    """ca.key: refused on the node, naming source_roots; http://127.0.0.1: refused, never requested; a root passes."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.bin").write_bytes(b"weights")
    with FlakyHttp(tmp_path / "srv") as srv, \
            running(tmp_path / "sys", agent_env={"LLMGW_AGENT_SOURCE_ROOTS": str(models)}) as s:
        write_file(srv.root / "m.gguf", 1024)
        key = s.data_dir / "pki" / "ca.key"
        assert key.is_file()
        s.apply(sim_model("keyread", source=f"file://{key}"))
        s.apply(sim_model("ssrf", source=f"{srv.url}/m.gguf"))
        s.apply(sim_model("rooted", source=f"file://{models / 'm.bin'}"))

        def message(model: str, words: str) -> str | None:
            return next((r["message"] for r in s.replicas(model) if words in r["message"]), None)

        said = wait_for(lambda: message("keyread", "source roots"), timeout=60, interval=0.3,
                        what="the ca.key replica refused by the node")
        assert f"spec.source {key} is outside this node's source roots (" in str(said)
        assert "add a root to source_roots in the agent's settings" in str(said)
        # The control plane's own metadata read is refused first ("memory not estimated: ... loopback"):
        # wait for the node's refusal, in its own words.
        said = wait_for(lambda: message("ssrf", "fetch_allow_private in the agent's settings"), timeout=60,
                        interval=0.3, what="the loopback replica refused by the node")
        assert f"{srv.url}/m.gguf" in str(said) and "fetch_allow_private in the agent's settings" in str(said)
        assert srv.seen == []   # the control plane's metadata read was refused too, before connecting
        # Nothing of the key reaches a viewer: not in the model, its replicas, or the events.
        shown = json.dumps([s.get("/api/v1/models/keyread"), s.replicas("keyread"), s.get("/api/v1/events")])
        assert "PRIVATE KEY" not in shown and key.read_text()[40:80] not in shown
        # The file under the root the settings add passes the check (whether its engine then starts here is
        # the engine sandbox's business: test_source_roots covers the resolution itself).
        wait_for(lambda: any(r["node"] for r in s.replicas("rooted")), timeout=30, interval=0.3, what="rooted placed")
        assert not [r for r in s.replicas("rooted") if "source roots" in r["message"]]
