"""The router verifies engines serving TLS (issue 28 §2), end to end on real TLS.

A standalone router process follows a control plane over HTTP (``RouterControl``) whose table carries
the cluster CA (``engine_ca``); the engines are ``bench/fast_upstream.py`` processes serving TLS with
certificates made by ``llmgw.core.pki``: the right engine of node-a, and three impostors at other
addresses claiming node-a's replicas: an engine certificate of another CA, the cluster CA's engine
certificate for node-b, and the cluster CA's server (non-engine) certificate. The ``openai`` client asks
for whole and streamed answers: every one is served, by the right engine, and each impostor is ejected
with its reason (posted to the control plane as a ``RouterReport``, what ``llmgw describe replica`` shows).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.api import routing
from llmgw.core import pki
from llmgw.testing.fakecontrol import RouterControl
from llmgw.testing.procs import free_port, wait_for
from llmgw.testing.routed import Spawner

ROOT = Path(__file__).resolve().parents[2]
FAST_UPSTREAM = ROOT / "bench" / "fast_upstream.py"
MODEL = "m"


def engine_pair(ca: pki.Issued, node: str) -> pki.Issued:
    key = pki.new_key()
    return pki.Issued(pki.sign_engine_csr(ca, pki.create_csr(node, key), node), pki.key_pem(key))


class Engines(Spawner):
    def engine(self, name: str, pair: pki.Issued | None) -> str:
        """A fast_upstream process serving TLS with ``pair`` (None: plain HTTP); its base URL once it listens."""
        port = free_port()
        argv = [sys.executable, str(FAST_UPSTREAM), "--port", str(port), "--model", MODEL]
        if pair is not None:
            cert, key = self.tmp_path / f"{name}.crt", self.tmp_path / f"{name}.key"
            cert.write_bytes(pair.cert_pem)
            key.write_bytes(pair.key_pem)
            key.chmod(0o600)
            argv += ["--cert-file", str(cert), "--key-file", str(key)]
        from llmgw.testing.procs import Proc
        self.procs.append(Proc.start(argv, log_path=self.tmp_path / f"{name}.log"))

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(listening, timeout=30, what=f"{name} listening")
        return f"{'https' if pair is not None else 'http'}://127.0.0.1:{port}"


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Engines]:
    made = Engines(tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


@pytest.fixture
def control() -> Iterator[RouterControl]:
    made = RouterControl(routing.EndpointsDoc(version=1))
    try:
        yield made
    finally:
        made.close()


def test_the_router_serves_only_the_engine_the_table_names_and_ejects_impostors(
        engines: Engines, control: RouterControl) -> None:
    ca, other_ca = pki.create_ca(), pki.create_ca(name="not the cluster CA")
    server = pki.server_cert(ca, ["127.0.0.1"])
    urls = {"r-good": engines.engine("good", engine_pair(ca, "node-a")),
            "r-other-ca": engines.engine("other-ca", engine_pair(other_ca, "node-a")),
            "r-node-b": engines.engine("node-b", engine_pair(ca, "node-b")),
            "r-server": engines.engine("server", server)}
    plain = engines.engine("plain", None)
    control.doc = routing.EndpointsDoc(version=1, engine_ca=ca.cert_pem.decode(), models=(
        routing.ModelEntry(name=MODEL, routing="round_robin", state="Ready", endpoints=tuple(
            routing.EndpointDoc(replica, url, api_key="engine-key", node="node-a") for replica, url in urls.items())),
        routing.ModelEntry(name="plain", served_name=MODEL, state="Ready",
                           endpoints=(routing.EndpointDoc("r-plain", plain, node="node-c"),))))
    control.start()
    router = engines.spawn_router("--control", control.url)
    client = openai.OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=30)

    served_by: list[str] = []
    for i in range(12):
        if i % 2:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
        else:
            raw = client.chat.completions.with_raw_response.create(model=MODEL,
                                                                   messages=[{"role": "user", "content": "hi"}])
            text = raw.parse().choices[0].message.content or ""
        assert text.startswith("hi"), text
        served_by.append(raw.headers["x-llmgw-upstream"])
    assert set(served_by) == {"r-good"}  # 12 of 12 answered, every one by node-a's engine

    # Each impostor was picked (round robin), refused at its handshake and ejected at once, with its reason.
    wait_for(lambda: {e["replica"] for e in control.events if e["type"] == "ejected"} >= urls.keys() - {"r-good"},
             timeout=15, what="the three ejections reported")
    reasons = {e["replica"]: e["reason"] for e in control.events if e["type"] == "ejected"}
    assert "r-good" not in reasons
    assert reasons["r-other-ca"].startswith(
        f"TLS: the engine at {urls['r-other-ca']} presented a certificate not issued by the cluster CA: ")
    assert reasons["r-node-b"] == (f"TLS: the engine at {urls['r-node-b']} presented a certificate for node "
                                   "node-b, not node node-a")
    assert reasons["r-server"].startswith(f"TLS: the engine at {urls['r-server']} presented a cluster certificate "
                                          "that is not an engine certificate")
    assert {e["failures"] for e in control.events if e["type"] == "ejected"} == {1}

    # A plain http:// engine beside them is served as before.
    answer = client.chat.completions.with_raw_response.create(model="plain",
                                                              messages=[{"role": "user", "content": "hi"}])
    assert answer.headers["x-llmgw-upstream"] == "r-plain"
    assert answer.parse().choices[0].message.content == "hi"
