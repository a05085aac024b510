"""A local HTTP file server that misbehaves on purpose: throttles, drops connections, serves wrong bytes.

``with FlakyHttp(root) as srv:`` serves the files under ``root`` at ``srv.url`` (127.0.0.1, a free port,
one thread per connection, HTTP/1.1 keep-alive) with ``Range`` (``bytes=N-`` and ``bytes=N-M``),
``If-Range`` against its strong ETag (size and mtime, as nginx makes it) and ``HEAD``. Its faults are
attributes a test may change while a transfer runs:

* ``rate_bps``: None = as fast as it can (``sendfile``); a number paces the body; 0 holds it (a stall)
  until the number changes or the server closes;
* ``drop_after``: close the connection after sending this many body bytes of a response, once
  (``drop_every=False``) or on every response;
* ``corrupt``: serve bytes of the right length but the wrong content;
* ``head_status``: answer every HEAD with this status and no headers (a server without HEAD);
* ``aliases`` maps a URL path to a file under root, and ``extra_headers`` adds headers per URL path, so a
  test can dress a file up as something else (an HF resolve URL with its X-Linked-Etag);
  ``json_routes`` answers a URL path with a JSON document.

It records every request it saw (``seen``: method, path, Range, If-Range, whether it carried an
Authorization header): ``count("GET", path)`` and ``ranges(path)`` are what tests assert on. The bench
reuses it as the server both llmgw's fetcher and ``curl`` download from.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import http.server
import json
import random
import re
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Self

from llmgw.core import netpolicy

_CHUNK = 64 * 1024
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclasses.dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str           # the Range header, "" when none
    if_range: str        # the If-Range header, "" when none
    authorized: bool     # whether an Authorization header came with it


class FlakyHttp:
    """Serves ``root`` over HTTP on 127.0.0.1 with faults a test switches on and off."""

    def __init__(self, root: Path, *, rate_bps: float | None = None, drop_after: int | None = None,
                 drop_every: bool = False, corrupt: bool = False) -> None:
        self.root = Path(root)
        self.rate_bps = rate_bps
        self.drop_after = drop_after
        self.drop_every = drop_every
        self.corrupt = corrupt
        self.head_status: int | None = None   # e.g. 405: a server that answers no HEAD (sizes come with the GET)
        self.aliases: dict[str, str] = {}
        self.extra_headers: dict[str, dict[str, str]] = {}
        self.json_routes: dict[str, Any] = {}
        self.redirects: dict[str, str] = {}   # path -> Location: answered 302 (HEAD and GET)
        self.seen: list[Seen] = []
        self.drops = 0
        self.closing = False
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def allowed(self) -> str:
        """This server's host:port, for ``fetch_allow_private``: a fetcher refuses loopback unless told."""
        return f"127.0.0.1:{self.port}"

    def policy(self) -> netpolicy.Policy:
        """A fetcher's address policy allowing this loopback server (and nothing else on loopback)."""
        return netpolicy.Policy.of([self.allowed], setting="fetch_allow_private in the agent's settings")

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; a response held at rate 0 ends (its handler sees ``closing``)."""
        self.closing = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def count(self, method: str = "GET", path: str | None = None) -> int:
        """How many requests of ``method`` (for ``path``, when given) the server saw."""
        with self._lock:
            return sum(1 for s in self.seen if s.method == method and (path is None or s.path == path))

    def ranges(self, path: str | None = None) -> list[str]:
        """The Range headers of the GETs it saw (for ``path``, when given), in order; "" for a GET without one."""
        with self._lock:
            return [s.range for s in self.seen if s.method == "GET" and (path is None or s.path == path)]

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def _take_drop(self) -> int | None:
        """The byte count after which this response drops, or None; a once-only drop is used up here."""
        with self._lock:
            if self.drop_after is None:
                return None
            after = self.drop_after
            if not self.drop_every:
                self.drop_after = None
            return after


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-body is what these tests do on purpose; anything else is still printed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection's requests, answered from ``flaky``'s files with its faults (set by ``_handler``)."""

    flaky: FlakyHttp
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        if self.flaky.head_status is not None:
            self.flaky._record(Seen(method="HEAD", path=self.path, range="", if_range="",
                                    authorized="Authorization" in self.headers))
            self.send_response(self.flaky.head_status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        path = urllib.parse.urlsplit(self.path).path
        self.flaky._record(Seen(method=self.command, path=path, range=self.headers.get("Range", ""),
                                if_range=self.headers.get("If-Range", ""),
                                authorized="Authorization" in self.headers))
        if path in self.flaky.redirects:
            self.send_response(302)
            self.send_header("Location", self.flaky.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in self.flaky.json_routes:
            body = json.dumps(self.flaky.json_routes[path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        self._serve_file(path, head=head)

    def _serve_file(self, path: str, *, head: bool) -> None:
        """A file under root (or an alias), whole or the Range asked, with its ETag and Last-Modified."""
        rel = self.flaky.aliases.get(path, urllib.parse.unquote(path).lstrip("/"))
        file = (self.flaky.root / rel).resolve()
        if not file.is_relative_to(self.flaky.root.resolve()) or not file.is_file():
            self.send_error(404)
            return
        st = file.stat()
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        start, end = 0, st.st_size - 1
        status = 200
        asked = _RANGE.match(self.headers.get("Range", "").strip())
        if_range = self.headers.get("If-Range", "")
        if asked and (not if_range or if_range == etag):
            start = int(asked.group(1))
            end = min(int(asked.group(2)), end) if asked.group(2) else end
            if start >= st.st_size or start > end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{st.st_size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{st.st_size}")
        for k, v in self.flaky.extra_headers.get(path, {}).items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        self._body(file, start, length)

    def _body(self, file: Path, start: int, length: int) -> None:
        drop = self.flaky._take_drop()
        with open(file, "rb") as f:
            if drop is None and self.flaky.rate_bps is None and not self.flaky.corrupt:
                self.wfile.flush()
                self.connection.sendfile(f, offset=start, count=length)
                return
            f.seek(start)
            sent = 0
            while sent < length:
                want = min(_CHUNK, length - sent)
                if drop is not None:
                    want = min(want, drop - sent)
                    if want <= 0:
                        self.flaky.drops += 1
                        self.close_connection = True
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                if not self._pace(want):
                    return
                data = f.read(want)
                if self.flaky.corrupt:
                    data = bytes(b ^ 0xFF for b in data)
                self.wfile.write(data)
                self.wfile.flush()
                sent += len(data)

    def _pace(self, n: int) -> bool:
        """Wait as long as ``rate_bps`` asks for n bytes; False when the server closes meanwhile."""
        while self.flaky.rate_bps == 0:
            if self.flaky.closing:
                self.close_connection = True
                return False
            time.sleep(0.02)
        if self.flaky.rate_bps:
            time.sleep(n / self.flaky.rate_bps)
        return not self.flaky.closing



def _handler(server: FlakyHttp) -> type[http.server.BaseHTTPRequestHandler]:
    """The handler class of ``server``: ``_Handler`` bound to it (http.server makes one per connection)."""
    return type("Handler", (_Handler,), {"flaky": server})


def write_file(path: Path, size: int, *, seed: int = 1) -> bytes:
    """Write ``size`` seeded random bytes (so a spliced or shifted file is caught) and return them."""
    write_big(path, size, seed=seed)
    return path.read_bytes()


def write_big(path: Path, size: int, *, seed: int = 1) -> str:
    """Write ``size`` seeded random bytes in 64 MiB blocks (a 2 GB bench file without 2 GB of memory); its sha256."""
    rng = random.Random(seed)
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            block = rng.randbytes(min(left, 64 << 20))
            f.write(block)
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()
