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
bytes are written (``partial.Sink``), so verifying a 100 GB file costs no second read; after a restart the
bytes already on disk are hashed once before the transfer continues. Where the partial bytes came from is
``partial.Sidecar``.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

from llmgw.agent.fetch import guard, records
from llmgw.agent.fetch import meter as meter_mod
from llmgw.agent.fetch.partial import Sidecar, Sink
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
