"""``llmgw router --tls-cert/--tls-key``: the standalone router's own listener on HTTPS, as real processes.

A sim engine behind a router with two workers (a hub and two processes on one port) serving HTTPS with an
operator's certificate: the ``openai`` client trusting its CA gets an answer with HSTS; the files rewritten,
every worker reloads them and new connections get the new certificate. Beyond loopback without TLS the router
warns, and ``--plain-http`` marks its answers instead (decided without binding anything but 127.0.0.1).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509

from llmgw.core import pki
from llmgw.router import httphead, standalone
from llmgw.router.settings import RouterSettings
from llmgw.testing.procs import Proc, free_port, wait_for


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


def _pair(directory: Path, ca: pki.Issued) -> int:
    issued = pki.server_cert(ca, ["127.0.0.1"])
    (directory / "router.key").write_bytes(issued.key_pem)
    (directory / "router.pem").write_bytes(issued.cert_pem + ca.cert_pem)
    return pki.load_cert(issued.cert_pem).serial_number


def _serial(port: int, ca_file: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"").serial_number


def test_a_router_with_workers_serves_https_and_every_worker_reloads_a_renewed_certificate(
        tmp_path: Path, procs: list[Proc]) -> None:
    ca = pki.create_ca(name="a public CA")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    first = _pair(tmp_path, ca)
    sim_port, port = free_port(), free_port()
    procs.append(Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--host", "127.0.0.1", "--port", str(sim_port),
                             "--model", "m"], log_path=tmp_path / "sim.log"))
    procs[-1].wait_http(f"http://127.0.0.1:{sim_port}/health", timeout=30)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"version": 1, "models": [
        {"name": "m", "state": "Ready", "endpoints": [{"replica_id": "m-1", "url": f"http://127.0.0.1:{sim_port}"}]}]}))
    router = Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port", str(port),
                         "--table-file", str(table), "--workers", "2", "--tls-cert", str(tmp_path / "router.pem"),
                         "--tls-key", str(tmp_path / "router.key")], log_path=tmp_path / "router.log")
    procs.append(router)
    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    router.wait_http(url + "/v1/models", timeout=30, context=trust)
    with httpx.Client(verify=str(tmp_path / "ca.crt")) as http:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", http_client=http)
        raw = client.chat.completions.with_raw_response.create(model="m", max_tokens=4,
                                                                messages=[{"role": "user", "content": "hi"}])
        assert raw.parse().choices[0].message.content
        assert raw.headers["strict-transport-security"] == "max-age=31536000"
    assert _serial(port, tmp_path / "ca.crt") == first
    # Both workers listening (each loaded the first pair) before the files change.
    wait_for(lambda: router.log_tail(500).count("router on https://") >= 2, timeout=30, what="both workers up")
    second = _pair(tmp_path, ca)

    def reloaded() -> int:
        return router.log_tail(500).count("TLS certificate reloaded")

    wait_for(lambda: reloaded() >= 2, timeout=20, what="both workers reloaded")
    assert {_serial(port, tmp_path / "ca.crt") for _ in range(12)} == {second}
    assert "router on https://127.0.0.1" in router.log_tail(500)


def test_a_router_refuses_a_pair_that_does_not_match_at_start(tmp_path: Path) -> None:
    ca = pki.create_ca()
    _pair(tmp_path, ca)
    (tmp_path / "other.key").write_bytes(pki.server_cert(ca, ["127.0.0.1"]).key_pem)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"version": 1, "models": []}))
    for workers in ("1", "2"):
        with Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--port", str(free_port()), "--table-file",
                         str(table), "--workers", workers, "--tls-cert", str(tmp_path / "router.pem"), "--tls-key",
                         str(tmp_path / "other.key")], log_path=tmp_path / f"refused{workers}.log") as proc:
            assert proc.popen.wait(timeout=30) == 2
            assert "--tls-key" in proc.log_tail() and "is not the key of the certificate" in proc.log_tail()


def test_beyond_loopback_without_tls_the_router_warns_and_plain_http_marks_instead(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llmgw.router.standalone"):
        assert standalone.listener_tls(RouterSettings(host="0.0.0.0", table_file=Path("t.json"))) is None
    assert "PLAIN HTTP on 0.0.0.0" in caplog.text and "--tls-cert/--tls-key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llmgw.router.standalone"):
        settings = RouterSettings(host="0.0.0.0", plain_http=True, table_file=Path("t.json"))
        assert standalone.listener_tls(settings) is None
        standalone.listener_tls(RouterSettings(host="127.0.0.1", table_file=Path("t.json")))
    assert not caplog.text
    assert standalone.listener_marks(settings) == (httphead.PLAIN_HTTP_MARK,)
    assert standalone.listener_marks(RouterSettings(table_file=Path("t.json"))) == ()
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        RouterSettings(tls_cert=Path("a.pem"))
    with pytest.raises(ValueError, match="--plain-http and --tls-cert contradict"):
        RouterSettings(tls_cert=Path("a.pem"), tls_key=Path("a.key"), plain_http=True)
