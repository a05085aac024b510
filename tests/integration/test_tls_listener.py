"""The router's HTTP server on TLS (``router.server.Server`` with ``router.tlslisten.CertReloader``), in process.

Real TLS on 127.0.0.1 with certificates from a real CA (``core.pki``), clients on real sockets: the scope's
scheme, HSTS, ALPN, Nagle off, and a certificate replaced on disk served to new connections while open ones
keep theirs; a half-written or mismatched pair keeps the old certificate until the files change again.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from llmgw.core import pki
from llmgw.router import httphead, server, tlslisten
from llmgw.router.asgi import send_bytes


def _run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


async def _echo_scheme(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send_bytes(send, 200, scope["scheme"].encode())


@pytest.fixture
def ca() -> pki.Issued:
    return pki.create_ca()


def _write_pair(tmp: Path, ca: pki.Issued, *, cert_name: str = "api.crt", key_name: str = "api.key") -> int:
    """A new certificate for 127.0.0.1 and its key written over ``tmp``'s files; its serial."""
    issued = pki.server_cert(ca, ["127.0.0.1"])
    (tmp / key_name).write_bytes(issued.key_pem)
    (tmp / cert_name).write_bytes(issued.cert_pem + ca.cert_pem)
    return pki.load_cert(issued.cert_pem).serial_number


def _client_ctx(ca: pki.Issued, tmp: Path) -> ssl.SSLContext:
    (tmp / "ca.crt").write_bytes(ca.cert_pem)
    ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


class _Client:
    """One keep-alive HTTP/1.1 connection over TLS."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, ctx: ssl.SSLContext | None) -> _Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                       server_hostname="127.0.0.1" if ctx else None)
        return cls(reader, writer)

    @property
    def serial(self) -> int:
        der = self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number

    async def get(self, path: str = "/") -> tuple[bytes, bytes]:
        self.writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        return head, await self.reader.readexactly(length)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def test_https_says_https_with_hsts_http_1_1_and_nagle_off_and_plain_keeps_http(tmp_path: Path, ca: pki.Issued) -> None:
    _write_pair(tmp_path, ca)
    reloader = tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "api.key")

    async def main() -> None:
        tls_srv = server.Server(_echo_scheme, marks=(httphead.HSTS,))
        plain_srv = server.Server(_echo_scheme)
        tls_port = (await tls_srv.start("127.0.0.1", 0, ssl=reloader.context)).sockets[0].getsockname()[1]
        plain_port = (await plain_srv.start("127.0.0.1", 0)).sockets[0].getsockname()[1]
        try:
            c = await _Client.open(tls_port, _client_ctx(ca, tmp_path))
            head, body = await c.get()
            assert body == b"https" and b"strict-transport-security: max-age=31536000" in head.lower(), head
            ssl_object = c.writer.get_extra_info("ssl_object")
            assert ssl_object.selected_alpn_protocol() == "http/1.1"   # h2 offered, not taken
            assert ssl_object.version() in ("TLSv1.2", "TLSv1.3")
            (conn,) = tls_srv.connections
            sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            await c.close()
            p = await _Client.open(plain_port, None)
            head, body = await p.get()
            assert body == b"http" and b"strict-transport-security" not in head.lower(), head
            (conn,) = plain_srv.connections
            assert conn.transport.get_extra_info("socket").getsockopt(  # type: ignore[union-attr]
                socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            await p.close()
            # A client that does not trust the CA is refused at the handshake.
            with pytest.raises(ssl.SSLCertVerificationError):
                await _Client.open(tls_port, ssl.create_default_context())
        finally:
            await tls_srv.shutdown(1)
            await plain_srv.shutdown(1)

    _run(main())


def test_new_connections_get_a_replaced_certificate_while_an_open_one_keeps_its_own(tmp_path: Path,
                                                                                    ca: pki.Issued) -> None:
    first = _write_pair(tmp_path, ca)
    reloader = tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "api.key", poll_s=0.05)

    async def main() -> None:
        srv = server.Server(_echo_scheme)
        port = (await srv.start("127.0.0.1", 0, ssl=reloader.context)).sockets[0].getsockname()[1]
        watch = asyncio.create_task(reloader.run())
        ctx = _client_ctx(ca, tmp_path)
        try:
            old = await _Client.open(port, ctx)
            assert old.serial == first
            second = _write_pair(tmp_path, ca)   # as an operator's renewal: new key and certificate over the old
            for _ in range(200):   # the watch notices on its own (os.stat every 50 ms here)
                if reloader.reloads:
                    break
                await asyncio.sleep(0.05)
            new = await _Client.open(port, ctx)
            assert new.serial == second != first
            # The open connection keeps its certificate and goes on serving.
            assert (await old.get())[1] == b"https" and old.serial == first
            assert (await new.get())[1] == b"https"
            await old.close()
            await new.close()
        finally:
            watch.cancel()
            await srv.shutdown(1)

    _run(main())


def test_a_half_written_or_mismatched_pair_keeps_the_old_certificate_until_the_next_change(
        tmp_path: Path, ca: pki.Issued, caplog: pytest.LogCaptureFixture) -> None:
    first = _write_pair(tmp_path, ca)
    # Polled by hand; a pair changed less than poll_s ago is not judged yet: 0 here, so each poll judges it.
    reloader = tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "api.key", poll_s=0.0)
    new = pki.server_cert(ca, ["127.0.0.1"])

    async def serial() -> int:
        c = await _Client.open(port, _client_ctx(ca, tmp_path))
        try:
            return c.serial
        finally:
            await c.close()

    async def main() -> None:
        nonlocal port
        srv = server.Server(_echo_scheme)
        port = (await srv.start("127.0.0.1", 0, ssl=reloader.context)).sockets[0].getsockname()[1]
        try:
            # The certificate is written, the key not yet: a mismatched pair, refused with a warning.
            (tmp_path / "api.crt").write_bytes(new.cert_pem + ca.cert_pem)
            with caplog.at_level(logging.WARNING, logger="llmgw.router.tlslisten"):
                assert not reloader.poll()
            assert "not reloaded" in caplog.text and "is not the key of the certificate" in caplog.text
            assert await serial() == first
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="llmgw.router.tlslisten"):
                assert not reloader.poll()   # nothing changed since: not read, not warned again
            assert not caplog.text
            # A key cut half way: still refused, the old certificate still served.
            (tmp_path / "api.key").write_bytes(new.key_pem[: len(new.key_pem) // 2])
            assert not reloader.poll() and await serial() == first
            # The whole key: the next change loads the pair.
            (tmp_path / "api.key").write_bytes(new.key_pem)
            assert reloader.poll() and await serial() == pki.load_cert(new.cert_pem).serial_number
        finally:
            await srv.shutdown(1)

    port = 0
    _run(main())


def test_a_pair_changed_a_moment_ago_is_not_judged_until_it_stood_a_poll(tmp_path: Path, ca: pki.Issued,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A renewal writes one file then the other: the moment between is not warned about, and not remembered."""
    _write_pair(tmp_path, ca)
    reloader = tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "api.key", poll_s=3600.0)
    new = pki.server_cert(ca, ["127.0.0.1"])
    (tmp_path / "api.crt").write_bytes(new.cert_pem + ca.cert_pem)   # the key not yet
    with caplog.at_level(logging.WARNING, logger="llmgw.router.tlslisten"):
        assert not reloader.poll()
    assert not caplog.text
    (tmp_path / "api.key").write_bytes(new.key_pem)
    assert reloader.poll() and reloader.reloads == 1


def test_a_pair_that_cannot_serve_is_refused_at_start_naming_the_flag(tmp_path: Path, ca: pki.Issued) -> None:
    _write_pair(tmp_path, ca)
    with pytest.raises(tlslisten.TlsFilesError, match=r"--tls-cert .*missing.crt: cannot read it"):
        tlslisten.CertReloader(tmp_path / "missing.crt", tmp_path / "api.key")
    with pytest.raises(tlslisten.TlsFilesError, match=r"--tls-key .*missing.key: cannot read it"):
        tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "missing.key")
    (tmp_path / "other.key").write_bytes(pki.server_cert(ca, ["127.0.0.1"]).key_pem)
    with pytest.raises(tlslisten.TlsFilesError, match=r"--tls-key .*other.key is not the key of the certificate"):
        tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "other.key")
    with pytest.raises(tlslisten.TlsFilesError, match=r"--tls-cert .*api.key: no PEM certificate"):
        tlslisten.CertReloader(tmp_path / "api.key", tmp_path / "api.key")
