"""Answering a request for one of this node's logs: the agent's own ring, or a shard's log file.

Protobuf-free on purpose: the session turns a LogsRequest into these arguments
and each yielded batch into a LogsReply, so this module is tested with plain
files and a ring.

A shard's log can be gigabytes (an engine that logs every request), so the
tail is read backwards from the end in blocks, never from the start. Following
polls the file's size: engines write through a pipe into a plain file, and a
poll every quarter second is as prompt as anyone reading needs, without
inotify's platform differences. Bytes are decoded with replacement, because
an engine that prints a binary blob must not end the stream.

Batches are kept under a size the stream carries: gRPC refuses a message over
4 MiB by default, and 10000 lines of a chatty engine's config dump were more.

Only shards' logs are shown, and only of shards this node runs or ran: the id
in a request is checked (``shards.check_shard_id``) before it becomes a path,
and then must name a shard the supervisor has a record of, or one with a state
file or a log in the run directory (a shard that ended before the agent
restarted). Before this, ``shard=/var/log/dpkg`` read /var/log/dpkg.log and
``shard=../../x`` anything ending in ``.log`` the agent could open.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from llmgw.agent import logring
from llmgw.agent.supervisor import launching, statefiles
from llmgw.core import shards
from llmgw.core.errors import LlmgwError, ShardIdError

DEFAULT_LINES = 100
MAX_LINES = 10000
MAX_LINE_BYTES = 64 * 1024
MAX_BATCH_BYTES = 1 << 20
MAX_BATCH_LINES = 1000
# The most read backwards to find the tail. A file of one endless line (a
# progress bar without newlines) would otherwise be read whole.
MAX_TAIL_BYTES = 16 << 20
_BLOCK = 64 * 1024
# A line still being written is held back while following, so it is not shown
# as two; one that stands still this long (a prompt, a crash mid-line) is shown.
PARTIAL_FLUSH_S = 1.0


#: The most shard ids a refusal lists.
MAX_LISTED = 20


class UnknownShard(LlmgwError, LookupError):
    """A log was asked of a shard this node neither runs nor ran; the message lists the ones it has."""


class ShardLogs:
    """Which shard logs this node shows, and where each one is.

    ``known`` gives the ids the supervisor has a record of (running, or ended
    and not yet forgotten). A shard that ended before this agent started has
    no record, but its log (and, while its engine runs, its state file) is
    still in ``run_dir``, and that log is often the one that says why it died.
    """

    def __init__(self, run_dir: Path, *, node_id: str, known: Callable[[], Iterable[str]]) -> None:
        self._run_dir = run_dir
        self._node_id = node_id
        self._known = known

    def find(self, shard_id: str) -> Path:
        """``shard_id``'s log; ShardIdError for a string that is no shard id, UnknownShard for one not here."""
        path = launching.log_path_of(self._run_dir, shard_id)  # checks the id before it becomes a path
        if shard_id in set(self._known()) or path.is_file() or statefiles.path_of(self._run_dir, shard_id).is_file():
            return path
        here = self.here()
        listed = ", ".join(here[:MAX_LISTED]) + (f" and {len(here) - MAX_LISTED} more" if len(here) > MAX_LISTED
                                                 else "")
        raise UnknownShard(f"no shard {shard_id} on node {self._node_id}; shards here: {listed or 'none'}. "
                           "`llmgw get replicas` shows the node and shard of each replica")

    def here(self) -> list[str]:
        """Every shard id this node can show a log of, sorted."""
        ids = set(self._known())
        try:
            ids.update(e.stem for e in self._run_dir.iterdir() if e.suffix in (".log", statefiles.SUFFIX))
        except FileNotFoundError:
            pass  # nothing was ever launched here
        return sorted(i for i in ids if _is_shard_id(i))


def _is_shard_id(s: str) -> bool:
    try:
        shards.check_shard_id(s)
    except ShardIdError:
        return False
    return True


def clamp_lines(lines: int) -> int:
    """0 (or less) means the default; more than MAX_LINES is cut to it."""
    return DEFAULT_LINES if lines <= 0 else min(lines, MAX_LINES)


async def read(*, shard_id: str, lines: int, follow: bool, ring: logring.LogRing,
               shard_log: Callable[[str], Path | None], poll_s: float = 0.25) -> AsyncIterator[list[str]]:
    """Batches of log lines: the last ``lines``, then with ``follow`` new ones as they come.

    ``shard_id`` "" is the agent's own log; any other must be a valid shard
    id (ShardIdError otherwise, whatever ``shard_log`` would say), and
    ``shard_log`` finds its file or raises (None: LookupError). The first
    batch is always yielded, even empty, so a caller can answer at once.
    Cancelling the consuming task, or closing the iterator
    (``contextlib.aclosing``), stops it and releases the file or subscription.
    """
    n = clamp_lines(lines)
    if not shard_id:
        async for batch in _read_ring(ring, n, follow=follow):
            yield batch
        return
    # Here as well as in ShardLogs: this is the one door from a request to a
    # file, and a shard_log that builds a path must never see "../../etc/x".
    shards.check_shard_id(shard_id)
    path = shard_log(shard_id)
    if path is None:
        raise LookupError(f"no shard {shard_id} on this node; `llmgw get replicas` lists where each runs")
    async for batch in _read_file(path, n, follow=follow, poll_s=poll_s):
        yield batch


async def _read_ring(ring: logring.LogRing, n: int, *, follow: bool) -> AsyncIterator[list[str]]:
    if not follow:
        for batch in _batches(ring.tail(n)):
            yield batch
        return
    tail, sub = ring.tail_and_subscribe(n)
    with sub:
        for batch in _batches(tail):
            yield batch
        async for new, dropped in sub:
            if dropped:
                new = [*new, f"[llmgw: {dropped} lines not shown: this reader fell behind the agent's log]"]
            for batch in _batches(new):
                yield batch


async def _read_file(path: Path, n: int, *, follow: bool, poll_s: float) -> AsyncIterator[list[str]]:
    # Read on the event loop rather than in a thread: these are local files,
    # one block at a time, and a thread still reading when the task is
    # cancelled would race the close below.
    f = _open(path)
    try:
        # A file not written yet (the shard is still being launched) has an
        # empty tail, and when following, whatever it writes once it exists.
        tail, pending = _tail(f, n) if f is not None else ([], b"")
        if not follow and pending:
            # Shown now, as one of the `n`: it may be the last thing a crashed engine wrote.
            tail = [*tail, pending][-n:]
            pending = b""
        for batch in _batches([_decode(b) for b in tail]):
            yield batch
        if not follow:
            return
        follower, f = _Follower(path, f, pending), None  # the follower owns the file now
        try:
            while True:
                await asyncio.sleep(poll_s)
                new = follower.poll()
                if new:
                    for batch in _batches([_decode(b) for b in new]):
                        yield batch
        finally:
            follower.close()
    finally:
        if f is not None:
            f.close()


def _open(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LlmgwError(f"cannot read the log {path}: {e.strerror or e}") from None


def _tail(f: BinaryIO, n: int) -> tuple[list[bytes], bytes]:
    """The last ``n`` complete lines, and what follows the last newline (a line still being written)."""
    end = f.seek(0, os.SEEK_END)
    pos, data = end, b""
    while pos > 0 and data.count(b"\n") <= n and end - pos < MAX_TAIL_BYTES:
        step = min(_BLOCK, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
    f.seek(end)
    parts = data.split(b"\n")
    partial = parts.pop()
    if pos > 0 and parts:
        parts.pop(0)  # begins mid-line: the block boundary cut it
    return parts[-n:] if n else [], partial


class _Follower:
    """New complete lines of one log path, surviving truncation and rotation."""

    def __init__(self, path: Path, f: BinaryIO | None, pending: bytes) -> None:
        self._path = path
        self._f = f
        self._pending = pending
        self._pending_since = time.monotonic()

    def poll(self) -> list[bytes]:
        out: list[bytes] = []
        if self._f is not None:
            out += self._read_more()
            try:
                st = os.stat(self._path)
                if (st.st_ino, st.st_dev) != _identity(self._f):
                    # Rotated: the old file was renamed away (what it got last is
                    # read above) and a new one started under the same name.
                    out += self._flush()
                    self._f.close()
                    self._f = None
                elif st.st_size < self._f.tell():
                    # Truncated in place (`> file`, logrotate's copytruncate).
                    out += self._flush()
                    self._f.seek(0)
                    out += self._read_more()
            except FileNotFoundError:
                pass  # renamed and not yet recreated: keep reading the old one
        if self._f is None:
            self._f = _open(self._path)
            if self._f is not None:
                out += self._read_more()
        if self._pending and time.monotonic() - self._pending_since >= PARTIAL_FLUSH_S:
            out += self._flush()
        return out

    def _read_more(self) -> list[bytes]:
        assert self._f is not None
        out: list[bytes] = []
        while chunk := self._f.read(_BLOCK):
            parts = (self._pending + chunk).split(b"\n")
            self._pending = parts.pop()
            self._pending_since = time.monotonic()
            out += parts
            if len(self._pending) > MAX_LINE_BYTES:
                out += self._flush()  # an endless line: shown in pieces, not held forever
            if len(out) >= MAX_LINES:
                break  # the rest waits for the next poll, so one poll cannot hold the loop
        return out

    def _flush(self) -> list[bytes]:
        pending, self._pending = self._pending, b""
        return [pending] if pending else []

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _identity(f: BinaryIO) -> tuple[int, int]:
    st = os.fstat(f.fileno())
    return st.st_ino, st.st_dev


def _decode(line: bytes) -> str:
    if len(line) > MAX_LINE_BYTES:
        cut = len(line) - MAX_LINE_BYTES
        line = line[:MAX_LINE_BYTES] + f" [llmgw: {cut} more bytes on this line not shown]".encode()
    return line.removesuffix(b"\r").decode("utf-8", errors="replace")


def _batches(lines: list[str]) -> list[list[str]]:
    """``lines`` cut into batches under MAX_BATCH_BYTES and MAX_BATCH_LINES; at least one, maybe empty."""
    out: list[list[str]] = [[]]
    size = 0
    for line in lines:
        if out[-1] and (size + len(line) > MAX_BATCH_BYTES or len(out[-1]) >= MAX_BATCH_LINES):
            out.append([])
            size = 0
        out[-1].append(line)
        size += len(line) + 1
    return out
