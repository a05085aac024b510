"""Router-to-engine TLS (issue 28 §2) in parts: the table's ``engine_ca`` on the wire and from the control plane,
the verification context, and the router's pool on real TLS: one handshake per kept-alive connection, Nagle
off, the load scrape through the verified pool, a connection refused before a byte of the request is sent.

End to end (a router process, impostor engines, the ejection reasons):
tests/integration/test_router_verifies_engines.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.api.routing import EndpointDoc, EndpointsDoc, ModelEntry
from llmgw.control.cluster import Cluster
from llmgw.control.store.store import Store
from llmgw.core import pki
from llmgw.router import client, enginetls, health, loadwatch
from llmgw.router.table import RouteTable

CA = pki.create_ca()


def engine_pair(ca: pki.Issued, node: str) -> pki.Issued:
    key = pki.new_key()
    return pki.Issued(pki.sign_engine_csr(ca, pki.create_csr(node, key), node), pki.key_pem(key))


# -- the wire and the control plane -----------------------------------------------------------------------
def test_the_table_carries_the_engine_ca_and_reads_back_and_older_tables_have_none() -> None:
    doc = EndpointsDoc(version=2, engine_ca=CA.cert_pem.decode(),
                       models=(ModelEntry(name="m", endpoints=(EndpointDoc("r", "https://h:1", node="a"),)),))
    sent = doc.to_doc()
    assert sent["engine_ca"] == CA.cert_pem.decode()
    assert EndpointsDoc.from_doc(sent) == doc
    assert RouteTable.from_doc(sent).engine_ca == CA.cert_pem.decode()
    assert RouteTable.from_doc(doc).engine_ca == CA.cert_pem.decode()  # in process, the object itself
    assert "engine_ca" not in EndpointsDoc(version=1).to_doc()  # an insecure server's table: as before
    assert EndpointsDoc.from_doc({"version": 1, "models": []}).engine_ca == ""  # an older control plane's
    assert not doc.same_routes(EndpointsDoc(version=2, models=doc.models))  # a new CA is a change to publish


def test_a_malformed_engine_ca_is_warned_about_and_trusts_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        read = EndpointsDoc.from_doc({"version": 1, "models": [], "engine_ca": 42})
    assert "engine_ca: expected a PEM certificate" in caplog.text
    assert read.engine_ca  # not "" (which would leave https:// engines to the default checks)
    expected = enginetls.expectations(read.engine_ca, [EndpointDoc("r", "https://h:1", node="a")], {})
    assert expected["https://h:1"].context is None
    assert expected["https://h:1"].broken.startswith("TLS: the table's engine_ca is not a PEM certificate")


def test_the_control_plane_publishes_its_ca_certificate_and_never_its_key(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    try:
        doc = Cluster(store, engine_ca=CA.cert_pem.decode()).endpoints_doc()
        assert doc.engine_ca == CA.cert_pem.decode()
        assert "PRIVATE KEY" not in str(doc.to_doc())
        assert Cluster(store).endpoints_doc().engine_ca == ""
    finally:
        store.close()


# -- the pieces --------------------------------------------------------------------------------------------
def test_one_context_per_ca_requiring_a_certificate_tls12_and_no_hostname() -> None:
    made = enginetls.context(CA.cert_pem.decode())
    assert made is enginetls.context(CA.cert_pem.decode())  # made once
    assert made.verify_mode is ssl.CERT_REQUIRED and not made.check_hostname
    assert made.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert made is not enginetls.context(pki.create_ca().cert_pem.decode())


def test_expectations_only_for_https_with_a_ca_kept_while_nothing_changes() -> None:
    endpoints = [EndpointDoc("r1", "https://h:1", node="a"), EndpointDoc("r2", "http://h:2", node="a")]
    assert enginetls.expectations("", endpoints, {}) == {}
    first = enginetls.expectations(CA.cert_pem.decode(), endpoints, {})
    assert list(first) == ["https://h:1"] and first["https://h:1"].node == "a"
    assert enginetls.expectations(CA.cert_pem.decode(), endpoints, first)["https://h:1"] is first["https://h:1"]
    moved = enginetls.expectations(CA.cert_pem.decode(), [EndpointDoc("r1", "https://h:1", node="b")], first)
    assert moved["https://h:1"] is not first["https://h:1"] and moved["https://h:1"].node == "b"
    nameless = enginetls.expectations(CA.cert_pem.decode(), [EndpointDoc("r1", "https://h:1")], {})["https://h:1"]
    assert nameless.context is None and "names no node" in nameless.broken


def test_a_tls_refusal_ejects_at_once_other_failures_after_the_threshold() -> None:
    outliers = health.Outliers(threshold=3, clock=lambda: 100.0)
    assert outliers.failed("r", "HTTP 503") is None
    ejection = outliers.failed("r2", "TLS: ...", at_once=True)
    assert ejection is not None and ejection.failures == 1 and ejection.reason == "TLS: ..."
    assert outliers.is_ejected("r2") and not outliers.is_ejected("r")


# -- the pool on real TLS ------------------------------------------------------------------------------------
class _Engine(asyncio.Protocol):
    """Answers every request with a short JSON body on a kept-alive connection."""

    def __init__(self, seen: dict[str, int]) -> None:
        self.seen = seen
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.seen["connections"] += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(rest) < length:
                return
            self.buf = rest[length:]
            self.seen["requests"] += 1
            body = b"m_running 0\n" if head.startswith(b"GET /metrics") else b'{"ok":true}'
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


async def _engine(pair: pki.Issued, tmp_path: Path, seen: dict[str, int]) -> AsyncIterator[str]:
    (tmp_path / "e.crt").write_bytes(pair.cert_pem)
    (tmp_path / "e.key").write_bytes(pair.key_pem)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(tmp_path / "e.crt", tmp_path / "e.key")
    server = await asyncio.get_running_loop().create_server(lambda: _Engine(seen), "127.0.0.1", 0, ssl=server_tls)
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def test_one_handshake_per_kept_alive_connection_nagle_off_and_the_scrape_through_it(tmp_path: Path) -> None:
    async def main() -> None:
        seen = {"connections": 0, "requests": 0}
        engine = _engine(engine_pair(CA, "node-a"), tmp_path, seen)
        url = await anext(engine)
        pool = client.Pool()
        endpoint = EndpointDoc("r", url, node="node-a")
        pool.expect(enginetls.expectations(CA.cert_pem.decode(), [endpoint], {}))
        try:
            for _ in range(5):
                response = await pool.request(url, "/v1/completions", b"", b"{}")
                assert response.status == 200 and await response.read() == b'{"ok":true}'
            assert seen == {"connections": 1, "requests": 5}  # one handshake, then kept alive
            (connection,) = pool._all
            sock = connection.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

            loads = loadwatch.Loads()
            watch = loadwatch.LoadWatch(loads, lambda: [endpoint],
                                        verified=lambda e: pool.get(e.url, "/metrics", b""))
            await watch.scrape_once(None)  # type: ignore[arg-type]  # the session is not used for it
            assert "r" in loads.engine and seen["connections"] == 1  # through the verified connection

            # The table now says another node runs there: the idle connection is closed, the next one refused.
            pool.expect(enginetls.expectations(CA.cert_pem.decode(), [EndpointDoc("r", url, node="node-b")], {}))
            await asyncio.sleep(0)
            assert not pool._all
            with pytest.raises(client.TlsRefused, match="presented a certificate for node node-a, not node node-b"):
                await pool.request(url, "/v1/completions", b"", b"{}")
            assert seen["requests"] == 6  # 5 completions and the scrape: nothing written to the refused one
        finally:
            pool.close()
            await engine.aclose()

    asyncio.run(main())
