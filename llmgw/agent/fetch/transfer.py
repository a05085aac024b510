"""One file, downloaded into the partial area: resumed with Range, watched for stalls, hashed as it comes.

``attempt`` is one HTTP GET; the fetcher loops over attempts with backoff. Bytes already on disk are
never fetched twice: a dropped connection, a stall or an agent restart continues with ``Range: bytes=N-``
and ``If-Range: <etag>``, so a file that changed upstream comes back whole (200) instead of being
spliced onto the old one's first half. A 206 whose ETag or total differs from what the partial was
started from (a server that ignores If-Range) is also thrown away and started again from 0.

The GET runs in a worker thread with a blocking socket (http.client), reading 1 MiB at a time straight into
one buffer, writing and hashing it there: measured on loopback, reading the body through aiohttp on the
event loop reached 0.4x of ``curl -o`` from the same server, the thread 1.0-2.0x. A stall is the socket's
timeout (no byte for stall_s); the loop aborts the thread's connection when the fetch is cancelled and
waits for it, so the partial file is consistent before anyone resumes it. The hash is computed as the
bytes are written, so verifying a 100 GB file costs no second read; after a restart the bytes already on
disk are hashed once before the transfer continues.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import queue
import re
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmgw.agent.fetch import guard, records
from llmgw.agent.fetch import meter as meter_mod
from llmgw.core import errors, netpolicy

_BLOCK = 1 << 20
_REDIRECTS = 5
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Retry(Exception):
    """A failure worth another attempt (a drop, a stall, a 5xx); the message says what happened."""


class Stalled(Retry):
    """No byte for stall_s: the server or the path to it hangs."""


def hub_sha256(headers: Any) -> str:
    """The sha256 an HF endpoint states for an LFS file (X-Linked-Etag, else ETag), or "" when it states none."""
    for key in ("X-Linked-Etag", "ETag"):
        value = headers.get(key, "").strip().removeprefix("W/").strip('"').lower()
        if _SHA256.fullmatch(value):
            return value
    return ""


class Sidecar:
    """``<partial>/sidecar.json``: per file the URL, size, ETag and sha256 the partial bytes came from."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source
        self.files: dict[str, dict[str, Any]] = {}
        self.verified = False
        self.rel = ""   # the path inside the entry that ensure returns, kept so a verified download can be adopted
        self._lock = threading.Lock()   # files of one source are fetched by several threads at once
        try:
            doc = json.loads(path.read_text())
            if doc.get("source") == source:
                self.files = dict(doc.get("files", {}))
        except (OSError, ValueError, AttributeError):
            pass

    def save(self) -> None:
        with self._lock:
            # A copy: another thread may add its file's entry meanwhile (list() of a dict is atomic in CPython).
            files = {rel: dict(e) for rel, e in list(self.files.items())}
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"source": self.source, "files": files, "verified": self.verified,
                                       "rel": self.rel}))
            os.replace(tmp, self.path)

    def keeps(self, job: records.FileJob) -> bool:
        """Whether partial bytes recorded for ``job.rel`` are from the same file the plan now wants."""
        e = self.files.get(job.rel)
        if not e:
            return False
        if job.size and e.get("size") and e["size"] != job.size:
            return False
        if job.sha256 and e.get("sha256"):
            return bool(e["sha256"] == job.sha256)
        return bool(e.get("url") == job.url)


class _Hasher:
    """A running sha256 in its own thread, fed blocks in order.

    hashlib releases the GIL on large buffers, so hashing one block here overlaps
    receiving and writing the next in the transfer's thread. Measured with
    ``bench/fetch_throughput.py`` (2 GiB over loopback, sha256 checked): hashed in
    the receiving thread the fetch ran at 0.53-0.75x ``curl -o``; a 1 GiB fetch took
    0.46 s unhashed and 1.09 s hashed there.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self._thread = threading.Thread(target=self._run, name="llmgw-fetch-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            block = self._blocks.get()
            try:
                if block is None:
                    return
                self._hash.update(block)
            finally:
                self._blocks.task_done()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        # A copy: the transfer reads into one reusable buffer.
        self._blocks.put(bytes(data))

    def hexdigest(self) -> str:
        """The digest of everything fed so far (waits for the thread to catch up)."""
        self._blocks.join()
        return self._hash.hexdigest()

    def stop(self) -> None:
        self._blocks.put(None)
        self._thread.join()


class Sink:
    """The partial file: appends, its size, and (when wanted) a running sha256 of what it holds."""

    def __init__(self, path: Path, *, want_hash: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "ab")  # noqa: SIM115 - held across attempts, closed by close()
        self.size = self._f.tell()
        self.want_hash = want_hash
        self._hasher: _Hasher | None = None
        self._hashed = 0

    def _restart_hash(self) -> _Hasher:
        if self._hasher is not None:
            self._hasher.stop()
        self._hasher, self._hashed = _Hasher(), 0
        return self._hasher

    def catch_up(self) -> None:
        """Hash the bytes already on disk (a resume after restart): blocking, run it in a thread."""
        if not self.want_hash or (self._hasher is not None and self._hashed == self.size):
            return
        self._f.flush()
        hasher = self._restart_hash()
        with open(self.path, "rb") as f:
            while block := f.read(_BLOCK * 4):
                hasher.update(block)
                self._hashed += len(block)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._f.write(data)
        self.size += len(data)
        if self.want_hash and self._hashed == self.size - len(data):
            hasher = self._hasher or self._restart_hash()
            hasher.update(data)
            self._hashed += len(data)

    def truncate(self) -> None:
        self._f.truncate(0)
        self._f.seek(0)
        self.size = 0
        if self._hasher is not None:
            self._restart_hash()

    def hexdigest(self) -> str:
        self.catch_up()
        return (self._hasher or self._restart_hash()).hexdigest()

    def close(self) -> None:
        self._f.close()
        if self._hasher is not None:
            self._hasher.stop()
            self._hasher = None


class _Abort:
    """The connection a worker thread is reading, so the event loop can cut it when the fetch is cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self.cancelled = False

    def hold(self, conn: http.client.HTTPConnection | None) -> None:
        with self._lock:
            self._conn = conn
            if conn is not None and self.cancelled:
                raise Retry("cancelled")

    def cut(self) -> None:
        with self._lock:
            self.cancelled = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)   # the blocked recv returns at once
            except OSError:
                pass


async def attempt(job: records.FileJob, sink: Sink, side: Sidecar, *, meter: meter_mod.Meter, stall_s: float,
                  hub: bool, policy: netpolicy.Policy, on_size: Callable[[int], None] = lambda n: None,
                  tls: ssl.SSLContext | None = None) -> None:
    """One GET of ``job`` into ``sink``, from where it stopped; returns when the file has all its bytes.

    Raises Retry for what another attempt may cure, FetchError for what it cannot (404, a token refused,
    a size that contradicts the listing).
    """
    loop = asyncio.get_running_loop()
    abort = _Abort()

    def count(n: int) -> None:
        loop.call_soon_threadsafe(meter.add, n)

    def grown(n: int) -> None:
        loop.call_soon_threadsafe(meter.grow, n)

    def sized(n: int) -> None:
        async def check() -> None:
            on_size(n)
        asyncio.run_coroutine_threadsafe(check(), loop).result()

    work = loop.run_in_executor(None, _attempt, job, sink, side, stall_s, hub, policy, abort, count, grown, sized,
                                tls)
    try:
        await asyncio.shield(work)
    except asyncio.CancelledError:
        # Cut the connection and wait for the thread, through further cancels too (an agent's close() cancels
        # again): a thread still writing when a new fetch resumes the file would corrupt it.
        abort.cut()
        while not work.done():
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        raise


def _attempt(job: records.FileJob, sink: Sink, side: Sidecar, stall_s: float, hub: bool, policy: netpolicy.Policy,
             abort: _Abort, count: Callable[[int], None], grown: Callable[[int], None], sized: Callable[[int], None],
             tls: ssl.SSLContext | None = None) -> None:
    host = urllib.parse.urlsplit(job.url).netloc
    if job.size and sink.size > job.size:
        _restart(sink, count)
    if job.size and sink.size == job.size:
        return
    sink.catch_up()
    have = sink.size
    part = side.files.setdefault(job.rel, {"url": job.url, "size": job.size, "sha256": job.sha256, "etag": ""})
    headers = dict(job.headers)
    headers["Accept-Encoding"] = "identity"
    if have:
        headers["Range"] = f"bytes={have}-"
        if part.get("etag") and not part["etag"].startswith("W/"):
            headers["If-Range"] = part["etag"]
    conn, resp = _get(job.url, headers, stall_s=stall_s, abort=abort, policy=policy, tls=tls)
    try:
        etag = resp.headers.get("ETag", "")
        if resp.status == 416 or (resp.status == 206 and not _continues(resp, have, job, part, etag)):
            # The file changed upstream under a server that ignores If-Range: start it again rather than splice.
            _restart(sink, count)
            part["etag"] = ""
            raise Retry(f"{job.rel} changed on {host} since the partial download began; starting it again from 0")
        if resp.status not in (200, 206):
            _refuse(resp.status, job, host)
        if resp.status == 200 and have:
            _restart(sink, count)   # the server ignored the Range, or If-Range saw a new file: take it whole
        total = _total(resp)
        if hub and not job.sha256:
            job.sha256 = hub_sha256(resp.headers)
        if total and not job.size:
            sized(total)   # the disk check for a size no HEAD told: refuses before the body is read
            job.size = total
            grown(total)
        elif total and total != job.size:
            raise errors.FetchError(f"{job.url} is {total} bytes, but the listing said {job.size}; the file changed "
                                    "between listing and download: fetch again")
        part.update(url=job.url, size=job.size, sha256=job.sha256, etag=etag)
        side.save()
        sink.want_hash = sink.want_hash or bool(job.sha256)
        sink.catch_up()
        _body(resp, sink, stall_s=stall_s, host=host, total=job.size, count=count, abort=abort)
    finally:
        abort.hold(None)
        conn.close()
    if job.size and sink.size < job.size:
        raise Retry(f"{host} closed the connection at {sink.size} of {job.size} bytes of {job.rel}")


def _get(url: str, headers: dict[str, str], *, stall_s: float, abort: _Abort,
         policy: netpolicy.Policy,
         tls: ssl.SSLContext | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """GET ``url``, following redirects (the hub sends LFS files to a CDN); Authorization only to the first host.

    Every hop's host is checked against ``policy`` before its connection opens (``guard.connection``).
    """
    first = urllib.parse.urlsplit(url).netloc
    for _ in range(_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        # Resolved, checked against the policy (loopback, link-local, this node: refused) and pinned, per hop.
        try:
            conn = guard.connection(policy, url, timeout=stall_s, tls=tls)
        except OSError as exc:   # the name did not resolve: perhaps for a moment
            raise Retry(f"cannot resolve {parts.hostname}: {exc.strerror or exc}") from None
        sent = headers if parts.netloc == first else {k: v for k, v in headers.items() if k != "Authorization"}
        try:
            abort.hold(conn)
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=sent)
            resp = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise Stalled(f"no answer from {parts.netloc} for {stall_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise Retry(f"cannot reach {parts.netloc}: {exc or type(exc).__name__}") from None
        location = resp.headers.get("Location")
        if resp.status in (301, 302, 303, 307, 308) and location:
            resp.close()
            conn.close()
            url = urllib.parse.urljoin(url, location)
            continue
        return conn, resp
    raise errors.FetchError(f"{url}: more than {_REDIRECTS} redirects; check the endpoint")


def _body(resp: http.client.HTTPResponse, sink: Sink, *, stall_s: float, host: str, total: int,
          count: Callable[[int], None], abort: _Abort) -> None:
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    while True:
        try:
            n = resp.readinto(view)
        except TimeoutError:
            raise Stalled(f"no byte from {host} for {stall_s:g} s, at {sink.size} of {total or '?'} bytes") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Retry(f"the connection to {host} dropped at {sink.size} of {total or '?'} bytes "
                        f"({type(exc).__name__})") from None
        if not n:
            return
        sink.write(view[:n])
        count(n)
        if abort.cancelled:
            return


def _continues(resp: http.client.HTTPResponse, have: int, job: records.FileJob, part: dict[str, Any],
               etag: str) -> bool:
    m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
    if not m or int(m.group(1)) != have:
        return False
    if m.group(3) != "*" and job.size and int(m.group(3)) != job.size:
        return False
    return not (part.get("etag") and etag and etag != part["etag"])


def _total(resp: http.client.HTTPResponse) -> int:
    m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
    if m and m.group(3) != "*":
        return int(m.group(3))
    length = resp.headers.get("Content-Length", "")
    if resp.status == 200 and length.isdigit():
        return int(length)
    return 0


def _restart(sink: Sink, count: Callable[[int], None]) -> None:
    count(-sink.size)
    sink.truncate()


def _refuse(status: int, job: records.FileJob, host: str) -> None:
    if status in (408, 425, 429) or status >= 500:
        raise Retry(f"{host} answered {status} for {job.rel}")
    if status in (401, 403):
        raise errors.FetchError(f"{job.url} answered {status}: not allowed; for a gated or private hf repo give the "
                                "control plane a token (LLMGW_HF_TOKEN or --hub-token-file), or put the weights "
                                "on the cluster's mirror")
    if status in (404, 410):
        raise errors.FetchError(f"{job.url} answered {status}: no such file; check spec.source")
    raise errors.FetchError(f"{job.url} answered {status}, which the fetcher does not handle; check spec.source")
