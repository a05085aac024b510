"""Sending usage records to the control plane without losing or doubling one (issue 26).

A ``UsageJournal`` numbers each finished request's record (``seq`` 1, 2, 3... within a journal
whose id is random per journal) and sends them in ``UsageBatch``es through a ``UsageTransport``
(every ``interval_s``, or sooner once ``batch`` records wait), one batch at a time. The control plane
stores each record above the journal's mark once and answers the mark (``UsageAck.applied_through``):
what is at or below it is forgotten here. A batch that fails is sent again, the same seqs, so a
retry is never counted twice.

With a directory, each record is also appended to a file there (one JSON line, ``os.write`` on an
``O_APPEND`` descriptor: in the kernel when the request ends, so ``kill -9`` of the router loses
nothing; only the machine losing power can lose what the page cache held). The journal writes
*segments*, ``<journal>-<first seq>.jsonl``, starting a new one at most every ``interval_s``; a
segment whose records are all acknowledged is deleted, so the directory holds only what the control
plane has not stored. A router starting over a directory with segments in it sends their records
again under their own journal ids and seqs (the control plane applies only what it lacks) and
deletes them once acknowledged; its own records go to a new journal.

Without a directory the records are only in memory: a router killed with ``kill -9`` loses what it
had not sent, at most the last ``interval_s`` (N = 1 s by default) of requests plus a batch in
flight; a stop (SIGTERM) sends them first. While the control plane is unreachable, at most
``max_pending`` records wait in memory (the oldest dropped, said in the log); with a directory the
dropped ones stay on disk and are sent after the next restart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from llmgw.api import usage as wire
from llmgw.api.reports import BadReport
from llmgw.core.background import Background

log = logging.getLogger(__name__)

UsageTransport = Callable[[wire.UsageBatch], Awaitable[wire.UsageAck]]

INTERVAL_S = 1.0
BATCH = 500
MAX_PENDING = 1_000_000
SUFFIX = ".jsonl"
ACK_SUFFIX = ".acked"


class _Journal:
    """One journal's records not yet acknowledged, and (with a directory) its segments on disk."""

    def __init__(self, jid: str, *, current: bool = False) -> None:
        self.id = jid
        self.current = current  # its last segment is the one being written: kept until the next one starts
        self.pending: collections.deque[wire.UsageRow] = collections.deque()  # what a batch carries, as it is
        self.segments: list[tuple[int, Path]] = []  # (last seq written to it, path), oldest first
        self.acked = 0

    def ack(self, through: int, directory: Path | None) -> None:
        self.acked = max(self.acked, through)
        pending = self.pending
        if pending and pending[-1][0] <= through:
            pending.clear()  # the usual ack: the whole batch sent, and nothing came since
        while pending and pending[0][0] <= through:
            pending.popleft()
        while self.segments and self.segments[0][0] <= through and (len(self.segments) > 1 or not self.current):
            with contextlib.suppress(FileNotFoundError):
                self.segments[0][1].unlink()
            self.segments.pop(0)
        if directory is not None:
            # The mark, for the segment still being written: a restart skips what it covers.
            mark = directory / f"{self.id}{ACK_SUFFIX}"
            if self.segments:
                mark.write_text(str(self.acked))
            else:
                mark.unlink(missing_ok=True)


class UsageJournal:
    """Numbers, keeps (``directory``) and sends (``transport``) usage records; ``append`` never blocks."""

    def __init__(self, router_id: str, transport: UsageTransport | None, directory: Path | None = None, *,
                 interval_s: float = INTERVAL_S, batch: int = BATCH, max_pending: int = MAX_PENDING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.router_id = router_id
        self._transport = transport
        self._dir = directory
        self._interval_s = interval_s
        self._batch = max(1, min(batch, wire.MAX_RECORDS_PER_BATCH))
        self._max_pending = max_pending
        self._clock = clock
        self._current = _Journal(secrets.token_hex(8), current=True)
        self._seq = 0
        self._lines: list[bytes] = []
        self._write_soon = False
        self._fd = -1
        self._segment_at = 0.0
        self._replay: list[_Journal] = []
        self._wake = asyncio.Event()
        self._task = Background("llmgw-router-usage")
        #: Records acknowledged by the control plane, for tests and the log.
        self.sent = 0
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._replay = self._read_segments(directory)

    @property
    def journal_id(self) -> str:
        return self._current.id

    @property
    def pending(self) -> int:
        return sum(len(j.pending) for j in (*self._replay, self._current))

    def append(self, record: tuple[Any, ...]) -> None:
        """Numbers ``record`` (``metering.Record``: UsageRecord's fields without seq), writes it down, queues it."""
        seq = self._seq = self._seq + 1
        numbered = _row(wire.UsageRow, (seq, *record))
        journal = self._current
        if self._dir is not None:
            self._lines.append(_line(numbered))
            if not self._write_soon:
                # Written once the callbacks ready now have run (the answers being sent): one os.write for
                # the records of one turn of the event loop, in the kernel before the loop polls again.
                self._write_soon = True
                asyncio.get_running_loop().call_soon(self._write)
        if len(journal.pending) >= self._max_pending:
            journal.pending.popleft()
            if self._dir is None:
                log.warning("usage not reaching the control plane: dropping the oldest record (%d waiting)",
                            self._max_pending)
        journal.pending.append(numbered)
        if len(journal.pending) >= self._batch:
            self._wake.set()

    def _write(self) -> None:
        self._write_soon = False
        if not self._lines:
            return
        now = self._clock()
        if self._fd < 0 or now - self._segment_at >= self._interval_s:
            self._new_segment(now, self._seq - len(self._lines) + 1)
        data = b"".join(self._lines)
        self._lines.clear()
        while data:
            data = data[os.write(self._fd, data):]
        self._current.segments[-1] = (self._seq, self._current.segments[-1][1])

    def _new_segment(self, now: float, first: int) -> None:
        assert self._dir is not None
        if self._fd >= 0:
            os.close(self._fd)
        path = self._dir / f"{self._current.id}-{first:012d}{SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._segment_at = now
        self._current.segments.append((first, path))

    @staticmethod
    def _read_segments(directory: Path) -> list[_Journal]:
        """The journals a previous run left: their records not acknowledged, to send again."""
        journals: dict[str, _Journal] = {}
        for path in sorted(directory.glob(f"*{SUFFIX}")):
            jid, _, first = path.stem.rpartition("-")
            if not jid or not first.isdigit():
                continue
            journal = journals.setdefault(jid, _Journal(jid))
            last = 0
            for line in path.read_bytes().splitlines():
                try:
                    record = wire.UsageRecord.from_doc(str(path), json.loads(line))
                except (ValueError, BadReport):
                    continue  # a line cut short by a crash mid-write: never acknowledged, never counted
                journal.pending.append(_row(wire.UsageRow, tuple(getattr(record, f) for f in _FIELDS)))
                last = max(last, record.seq)
            journal.segments.append((last, path))
        for journal in journals.values():
            with contextlib.suppress(OSError, ValueError):
                journal.acked = int((directory / f"{journal.id}{ACK_SUFFIX}").read_text())
            journal.pending = collections.deque(sorted(r for r in journal.pending if r[0] > journal.acked))
            if journal.pending:
                log.info("usage journal %s: %d records from before the restart to send again", journal.id,
                         len(journal.pending))
        for journal in journals.values():
            if not journal.pending:  # everything in it was stored: nothing to send, the files go
                journal.ack(journal.acked, directory)
        return [j for j in journals.values() if j.pending or j.segments]

    # -- sending ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._transport is not None:
            self._task.start(self._run)

    async def stop(self, *, flush_s: float = 2.0) -> None:
        """Stop sending after one last try (at most ``flush_s``); what is not acknowledged stays on disk."""
        await self._task.stop()
        self._write()
        if self._transport is not None and self.pending:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), flush_s)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    async def flush(self) -> None:
        """Send batches until nothing waits; raises what the transport raised."""
        if self._dir is not None:
            self._write()
        while True:
            journal = next((j for j in (*self._replay, self._current) if j.pending), None)
            if journal is None:
                return
            await self._send(journal)

    async def _send(self, journal: _Journal) -> None:
        assert self._transport is not None
        # The rows as they wait: no object made per record (``UsageRow``s read like ``UsageRecord``s).
        records = tuple(itertools.islice(journal.pending, wire.MAX_RECORDS_PER_BATCH))
        batch = wire.UsageBatch(self.router_id, journal.id, records)
        ack = await self._transport(batch)
        if ack.journal != journal.id:
            raise ValueError(f"usage ack for journal {ack.journal!r}, sent {journal.id!r}")
        before = len(journal.pending)
        journal.ack(ack.applied_through, self._dir)
        self.sent += before - len(journal.pending)
        if journal is not self._current and not journal.pending and not journal.segments:
            self._replay.remove(journal)

    async def _run(self) -> None:
        backoff = self._interval_s
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), backoff)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # the control plane down or refusing: kept, sent again later
                if not failing:
                    log.warning("cannot send %d usage records to the control plane: %s; retrying", self.pending,
                                str(exc) or type(exc).__name__)
                failing = True
                backoff = min(backoff * 2, 10.0)
                continue
            if failing:
                log.info("usage records reach the control plane again")
            failing, backoff = False, self._interval_s


_FIELDS = wire.RECORD_FIELDS
#: ``tuple.__new__(UsageRow, values)``: a row made in C, not through the named tuple's ``__new__``.
_row = tuple.__new__
_LINE = (b'{"seq":%d,"at":%.6f%s,"prompt_tokens":%d,"cached_tokens":%d,"completion_tokens":%d,"spend_micros":%d,'
         b'"status":%d,"ttft_ms":%.3f,"duration_ms":%.3f}\n')
_prefixes: dict[tuple[str, ...], bytes] = {}


def _line(r: tuple[Any, ...]) -> bytes:
    """``r`` as one JSON line, by one ``%``; the names part (the same for every request of a key on a replica)
    made once."""
    seq, at, project, key, user, model, node, replica, prompt, cached, completion, spend, status, ttft, took = r
    names = (project, key, user, model, node, replica)
    prefix = _prefixes.get(names)
    if prefix is None:
        if len(_prefixes) > 10_000:
            _prefixes.clear()
        prefix = _prefixes[names] = b"".join(
            b',"%s":%s' % (f.encode(), json.dumps(v).encode()) for f, v in zip(_FIELDS[2:8], names, strict=True))
    return _LINE % (seq, at, prefix, prompt, cached, completion, spend, status, ttft, took)
