"""The router inside ``llmgw server``: per-replica limits reach its table from the spec, and it traces.

A real server and agent with a sim replica (``System``); spans go to an
``otlp.Collector`` named by ``LLMGW_TRACING_ENDPOINT``, the env form of
``--tracing-endpoint``, which the server process inherits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.core import skew
from llmgw.testing.otlp import Collector
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[System, Collector]]:
    with Collector() as collector:
        monkeypatch.setenv("LLMGW_TRACING_ENDPOINT", collector.url)
        s = System(tmp_path)
        try:
            s.start_server()
            s.start_agent("node1")
            yield s, collector
        finally:
            s.close()


def test_server_router_has_the_limit_and_traces_to_the_engine(traced: tuple[System, Collector]) -> None:
    """The spec's per-replica limit is in the router's table; spans arrive; the engine got traceparent."""
    system, collector = traced
    system.apply(sim_model("t", max_concurrency_per_replica=3))
    system.wait_model("t")
    system.wait_router("t", 1)
    # The endpoints document is served to router credentials only.
    router = system.request("POST", "/api/v1/routers", json={"name": "features-test"}).json()["token"]
    doc = system.request("GET", "/api/v1/endpoints", headers=as_router(router)).json()
    (model,) = [m for m in doc["models"] if m["name"] == "t"]
    assert model["limits"] == {"concurrency_per_replica": 3}
    assert model["engine"] == "sim"  # what the router may add for an engine (return_progress: llamacpp's)
    # Engines serving TLS are verified with the cluster CA: its certificate (never its key) is in the table.
    assert doc["engine_ca"] == (system.data_dir / "pki" / "ca.crt").read_text()

    answer = system.request("POST", "/v1/chat/completions", json={
        "model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert answer.status_code == 200
    (replica,) = system.replicas("t")
    seen = httpx.get(replica["endpoint"] + "/sim/stats", timeout=5).json()["traceparents"]
    assert len(seen) >= 2  # wait_router's request, then this one

    def exported() -> bool:  # every request the engine saw has its upstream span at the collector
        upstream_ids = {s.span_id.hex() for s in collector.spans if s.name == "upstream"}
        return all(tp.split("-")[2] in upstream_ids for tp in seen)
    wait_for(exported, timeout=20, what="the upstream spans the engine's traceparents name")
    names = {s.name for s in collector.spans}
    assert {"router /v1/chat/completions", "admission", "schedule", "upstream"} <= names


def as_router(token: str) -> dict[str, str]:
    """A router's headers for the endpoints document: its credential and this release's protocol."""
    return {"Authorization": f"Bearer {token}", **skew.headers()}
