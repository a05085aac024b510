"""TLS on a listener of the router's HTTP server: the server ``ssl.SSLContext`` and its certificate re-read in place.

:class:`CertReloader` owns one server context (TLS 1.2 and later, ALPN ``http/1.1`` only: the server is
httptools' HTTP/1.1) built from a certificate file (the leaf, then any intermediates/CA: clients get the
chain) and its key file. It polls both files (``os.stat`` only: mtime, size, inode) every ``poll_s``; when
either changed it reads both once, proves on a scratch context that the key matches the certificate, and
only then calls ``load_cert_chain`` on the live context. OpenSSL copies a context's certificate into each
connection as it is made, so new handshakes get the new certificate while open connections keep theirs:
a renewal restarts nothing and fails no request in flight. A half-written or mismatched pair (an operator
wrote the certificate, not yet the key) keeps the old certificate; once it has stood for a poll it is warned
about, once, and tried again at the next change of either file.

The key is never copied anywhere a path names on disk: the pair read is handed to OpenSSL through an
anonymous in-memory file (``memfd``; a 0700 temporary directory where there is none), so the pair that was
checked is exactly the pair that is loaded, even if the files change between the two.

Used alike by ``llmgw server`` (its cluster-CA ``api.crt``/``api.key``, which it rewrites on renewal, or the
operator's ``--tls-cert``/``--tls-key``), by each of its router workers and by the standalone router
(``--tls-cert``/``--tls-key``), which are given the two PATHS only, never the key's bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: How often the files are looked at (two ``os.stat`` calls).
POLL_S = 2.0
_Signature = tuple[tuple[int, int, int], tuple[int, int, int]]


class TlsFilesError(ValueError):
    """The certificate or key file cannot be used; the message says which flag and what to do."""


def server_context() -> ssl.SSLContext:
    """A server context without a certificate yet: TLS 1.2+, ALPN http/1.1, no renegotiation."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0) | ssl.OP_NO_COMPRESSION
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _stat(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@contextlib.contextmanager
def _as_files(cert: bytes, key: bytes) -> Iterator[tuple[str, str]]:
    """Paths OpenSSL can open that hold exactly ``cert`` and ``key``: in-memory files where the OS has them."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create("llmgw-tls-cert"), os.memfd_create("llmgw-tls-key")]
        try:
            for fd, data in zip(fds, (cert, key), strict=True):
                os.write(fd, data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    tmp = tempfile.mkdtemp(prefix="llmgw-tls-")  # 0700
    try:
        for name, data in (("cert.pem", cert), ("key.pem", key)):
            fd = os.open(os.path.join(tmp, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        yield os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    with _as_files(cert, key) as (cert_path, key_path):
        ctx.load_cert_chain(cert_path, key_path)


class CertReloader:
    """One server context whose certificate follows ``cert``/``key`` on disk; :meth:`run` polls them."""

    def __init__(self, cert: Path, key: Path, *, poll_s: float = POLL_S, cert_flag: str = "--tls-cert",
                 key_flag: str = "--tls-key") -> None:
        self.cert = Path(cert)
        self.key = Path(key)
        self.poll_s = poll_s
        self._flags = (cert_flag, key_flag)
        self.context = server_context()
        #: The files' signature last loaded or last refused (a refused pair is not read again until it changes).
        self._seen: _Signature | None = None
        #: How many times a changed pair was loaded since the first (a test and the log say so).
        self.reloads = 0
        sig, cert_pem, key_pem = self._read()
        self._check(cert_pem, key_pem)
        _load(self.context, cert_pem, key_pem)
        self._seen = sig

    def _read(self) -> tuple[_Signature, bytes, bytes]:
        """Both files' signature and bytes, read between two identical stats (else TlsFilesError: being written)."""
        cert_flag, key_flag = self._flags
        try:
            before = (_stat(self.cert), _stat(self.key))
        except OSError as e:
            which = cert_flag if e.filename == str(self.cert) else key_flag
            raise TlsFilesError(f"{which} {e.filename}: cannot read it ({e.strerror or e}); give a readable PEM "
                                "file") from None
        try:
            cert_pem, key_pem = self.cert.read_bytes(), self.key.read_bytes()
            after = (_stat(self.cert), _stat(self.key))
        except OSError as e:
            which = cert_flag if e.filename == str(self.cert) else key_flag
            raise TlsFilesError(f"{which} {e.filename}: cannot read it ({e.strerror or e}); give a readable PEM "
                                "file") from None
        if after != before:
            raise TlsFilesError(f"{cert_flag}/{key_flag}: the files changed while they were read (being written); "
                                "read again at their next change")
        return before, cert_pem, key_pem

    def _check(self, cert_pem: bytes, key_pem: bytes) -> None:
        """TlsFilesError unless ``key_pem`` is the private key of the first certificate in ``cert_pem``."""
        cert_flag, key_flag = self._flags
        if b"-----BEGIN CERTIFICATE-----" not in cert_pem:
            raise TlsFilesError(f"{cert_flag} {self.cert}: no PEM certificate in it (expected the server's "
                                "certificate, then its intermediates, each between BEGIN/END CERTIFICATE)")
        if b"PRIVATE KEY-----" not in key_pem:
            raise TlsFilesError(f"{key_flag} {self.key}: no PEM private key in it (expected the certificate's "
                                "unencrypted key, BEGIN PRIVATE KEY)")
        try:
            _load(server_context(), cert_pem, key_pem)
        except ssl.SSLError as e:
            reason = e.reason or str(e)
            if "KEY_VALUES_MISMATCH" in str(reason).upper() or "mismatch" in str(e).lower():
                raise TlsFilesError(f"{key_flag} {self.key} is not the key of the certificate in {cert_flag} "
                                    f"{self.cert} (key values mismatch); give the pair that belongs together") from None
            raise TlsFilesError(f"{cert_flag} {self.cert} / {key_flag} {self.key}: OpenSSL refused the pair "
                                f"({reason}); give a PEM certificate and its unencrypted PEM key") from None

    def poll(self) -> bool:
        """Loads the pair when either file changed and the new pair is sound; whether it was loaded.

        Only ``os.stat`` when nothing changed. A pair that cannot be used is remembered and warned about once;
        the old certificate stays until the files change again.
        """
        try:
            now = (_stat(self.cert), _stat(self.key))
        except OSError:
            return False   # one being replaced (renamed away for a moment): looked at again next time
        if now == self._seen:
            return False
        try:
            sig, cert_pem, key_pem = self._read()
            self._check(cert_pem, key_pem)
        except TlsFilesError as e:
            if "being written" in str(e):
                return False
            # Changed within the last poll: likely one of the two written and the other next (a renewal writes
            # both), so looked at again next time before it is called wrong; a pair still wrong then is warned.
            if time.time() - max(now[0][0], now[1][0]) / 1e9 < self.poll_s:
                log.debug("TLS certificate files changed a moment ago and do not make a pair yet: %s", e)
                return False
            self._seen = now
            log.warning("TLS certificate not reloaded, the one loaded before is kept: %s", e)
            return False
        _load(self.context, cert_pem, key_pem)
        self._seen = sig
        self.reloads += 1
        log.info("TLS certificate reloaded from %s (new connections get it; open ones keep theirs)", self.cert)
        return True

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.poll()
            except Exception:   # never let the watch die: the old certificate keeps serving
                log.exception("checking the TLS certificate files %s, %s failed", self.cert, self.key)
