"""Engine TLS with a real control plane and a real joined agent (``engine_tls: on``, on loopback) and a sim model:
the table names the engine https://, the engine serves the node's engine certificate (chained to the cluster CA,
``pki.engine_node`` = the node id), plain HTTP to it gets no answer, the agent's own TLS probes make it Ready,
and the server's router serves it over the verified TLS hop."""

from __future__ import annotations

import http.client
import socket
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llmgw.control import datadir
from llmgw.core import pki, skew
from llmgw.testing.system import System, running, sim_model

pytestmark = pytest.mark.slow


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    with running(tmp_path, agent_env={"LLMGW_AGENT_ENGINE_TLS": "on"}) as s:
        yield s


def _table_endpoint(s: System, model: str) -> dict[str, object]:
    router = s.request("POST", "/api/v1/routers", json={"name": "edge-tls"}).json()["token"]
    r = s.request("GET", "/api/v1/endpoints?timeout=0", headers={"Authorization": f"Bearer {router}", **skew.headers()})
    assert r.status_code == 200, r.text
    models = {m["name"]: m for m in r.json()["models"]}
    (endpoint,) = models[model]["endpoints"]
    return dict(endpoint)


def test_a_sim_engine_serves_tls_with_the_nodes_engine_certificate(system: System) -> None:
    s = system
    s.apply(sim_model("tls-sim"))
    s.wait_model("tls-sim", timeout=60)  # Ready: the agent's probes passed over TLS, checking the certificate
    endpoint = _table_endpoint(s, "tls-sim")
    url = urlsplit(str(endpoint["url"]))
    assert url.scheme == "https" and url.hostname == "127.0.0.1", endpoint
    assert endpoint["node"] == "node1"
    (replica,) = s.replicas("tls-sim")
    assert str(replica.get("endpoint", "")).startswith("https://"), replica

    ca_pem = datadir.read_ca(s.data_dir).cert_pem
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.check_hostname = False  # engine certificates carry no name: the node is checked instead
    with socket.create_connection((url.hostname, url.port), timeout=10) as raw, \
            ctx.wrap_socket(raw) as tls:  # verified: it chains to the cluster CA
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    assert pki.engine_node(cert) == "node1"
    assert pki.subject_alt_names(cert.public_bytes(serialization.Encoding.PEM)) == []
    # Another CA does not verify it.
    other = ssl.create_default_context(cadata=pki.create_ca().cert_pem.decode())
    other.check_hostname = False
    with socket.create_connection((url.hostname, url.port), timeout=10) as raw, \
            pytest.raises(ssl.SSLCertVerificationError):
        other.wrap_socket(raw)

    # The bearer key stays: over TLS without it the API is refused, with it served.
    api = http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=10)
    api.request("GET", "/v1/models")
    assert api.getresponse().status == 401
    api.close()

    # Plain HTTP to the TLS port gets no HTTP answer.
    plain = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionError)):
        plain.request("GET", "/health")
        plain.getresponse()
    plain.close()

    # The engine key is the node's second key, 0600 beside the node's; the engine's copy is in its work dir.
    state = s.root / "node1" / "pki"
    assert stat.S_IMODE((state / "engine.key").stat().st_mode) == 0o600
    assert (state / "engine.key").read_bytes() != (state / "node.key").read_bytes()
    assert (state / "engine.crt").read_bytes() == cert.public_bytes(serialization.Encoding.PEM)

    # Through the server's own router: it verifies the engine against the table's engine_ca and its node, and
    # relays whole answers and streams over the TLS hop.
    s.wait_router("tls-sim", 1, timeout=30)
    whole = s.request("POST", "/v1/chat/completions", json={
        "model": "tls-sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["message"]["content"]
    streamed = s.request("POST", "/v1/chat/completions", json={
        "model": "tls-sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True})
    assert streamed.status_code == 200, streamed.text
    assert streamed.text.rstrip().endswith("data: [DONE]")
    (replica,) = s.replicas("tls-sim")
    assert replica["router_ejections"] == [], replica  # the router took the engine for the node's: none ejected
