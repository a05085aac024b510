"""A small real HTTPS server on 127.0.0.1 for clients' trust tests: ``with serving(cert, ca) as server``.

It answers what a client reads before it trusts a control plane (``GET /api/v1/ca`` with the CA given, or
404 without one; ``GET /healthz``) and records every request line it receives, so a test can prove what a
refused client never sent. The certificate is whatever the test made (``pki.server_cert`` for the cluster's,
an engine's for one that names no host), served with the CA after it as ``llmgw server`` serves its chain.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from llmgw.core import pki


class Served:
    """The running server: its ``url`` and the request lines it received (``requests``), in order."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.requests: list[str] = []


def _handler(served: Served, ca_pem: bytes | None) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
            pass

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            served.requests.append(f"GET {self.path}")
            if self.path == "/api/v1/ca" and ca_pem is not None:
                self._answer(200, {"pem": ca_pem.decode(), "ca_hash": pki.ca_hash(ca_pem)})
            elif self.path == "/healthz":
                self._answer(200, {"status": "ok"})
            else:
                self._answer(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            served.requests.append(f"POST {self.path}")
            self._answer(401, {"error": {"message": "wrong password"}})

    return Handler


@contextlib.contextmanager
def serving(cert: pki.Issued, ca_pem: bytes | None) -> Iterator[Served]:
    """HTTPS on a free loopback port with ``cert`` (its chain: ``cert`` then ``ca_pem``); stopped after."""
    with tempfile.TemporaryDirectory() as tmp:
        chain, key = Path(tmp) / "chain.pem", Path(tmp) / "key.pem"
        chain.write_bytes(cert.cert_pem + (ca_pem or b""))
        key.write_bytes(cert.key_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(chain, key)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    served = Served(f"https://127.0.0.1:{httpd.server_address[1]}")
    httpd.RequestHandlerClass = _handler(served, ca_pem)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="tls-test-server", daemon=True)
    thread.start()
    try:
        yield served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
