"""Pull-through: a missing file is downloaded once from the upstream while every asker reads it as it grows.

Decision (single-flight per file): the first asker starts one download task, owned by ``Puller`` and not by
that asker's connection, so a client that hangs up does not abort it for the others. The task writes into a
temporary file under ``DIR/.partial``; every asker, the first included, opens that file and streams from it,
waiting whenever it has caught up with the download. So N nodes asking at once cost one upstream request,
and each of them gets bytes as soon as the mirror has them rather than after the whole file. When the
download completes it is checked (size always; sha256 when the upstream listed one) and renamed into
place; readers keep their open descriptor across the rename. A failed check deletes the temporary file and
ends every reader's response early, so a client sees a short body (never a wrong file that looks whole).

Revisions are single-flight too: a crowd resolving ``main`` for a repo the mirror lacks makes one set of
upstream API calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from llmgw.mirror import store as store_mod
from llmgw.mirror import upstream as upstream_mod

log = logging.getLogger(__name__)

CHUNK = 1 << 20


def _write_and_hash(fd: int, chunk: bytes, digest: Any) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]
    digest.update(chunk)


class Pull:
    """One file being downloaded: how far it has got, and whether it ended well."""

    def __init__(self, entry: store_mod.Entry, tmp: Path, final: Path) -> None:
        self.entry = entry
        self.tmp = tmp
        self.final = final
        self.done = 0
        self.verified = False
        self.finished = False
        self.error = ""
        self._progress = asyncio.Event()

    def available(self) -> int:
        """Bytes a reader may send: all once verified, else all but the last byte. Holding that byte back is
        what keeps a corrupt download from reaching a client as a complete response: without it, a reader
        caught up with the download had sent every byte and its Content-Length before the check failed."""
        return self.done if self.verified else min(self.done, self.entry.size - 1)

    def _notify(self) -> None:
        # Replace the event rather than clear it: a reader that was woken keeps its set event, and the next
        # waiter gets a fresh one.
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_past(self, offset: int) -> None:
        """Returns once more than ``offset`` bytes are available, or the download has ended."""
        while self.available() <= offset and not self.finished:
            await self._progress.wait()

    async def wait_finished(self) -> None:
        while not self.finished:
            await self._progress.wait()


class Puller:
    """Owns the downloads in flight (one per file) and the revision look-ups in flight (one per repo@rev)."""

    def __init__(self, store: store_mod.Store, upstream: upstream_mod.Upstream) -> None:
        self.store = store
        self.upstream = upstream
        self._files: dict[tuple[str, str, str], Pull] = {}
        self._revisions: dict[tuple[str, str], asyncio.Task[store_mod.Revision]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def file(self, repo: str, sha: str, entry: store_mod.Entry) -> Pull:
        """The download of ``entry``: the one in flight, or a new one started now. Call only when the file is
        not on disk; there is no await between that check and this call, so no second download can start."""
        key = (repo, sha, entry.path)
        pull = self._files.get(key)
        if pull is not None:
            return pull
        final = self.store.snapshot_file(repo, sha, entry.path)
        name = hashlib.sha256("\0".join(key).encode()).hexdigest()[:32]
        tmp = self.store.partial / name
        tmp.parent.mkdir(parents=True, exist_ok=True)
        # Created before the first reader opens it: readers open the file right after this returns.
        tmp.write_bytes(b"")
        pull = Pull(entry, tmp, final)
        self._files[key] = pull
        task = asyncio.create_task(self._run(repo, sha, pull), name=f"pull {repo}@{sha}/{entry.path}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pull

    async def _run(self, repo: str, sha: str, pull: Pull) -> None:
        entry = pull.entry
        digest = hashlib.sha256()
        try:
            fd = os.open(pull.tmp, os.O_WRONLY | os.O_TRUNC)
            try:
                async with self.upstream.download(repo, sha, entry.path) as body:
                    async for chunk in body.iter_chunked(CHUNK):
                        # Off the loop: hashing and writing 1 MiB takes ~1 ms, time the loop needs to serve readers.
                        await asyncio.to_thread(_write_and_hash, fd, chunk, digest)
                        pull.done += len(chunk)
                        self.upstream.stats.bytes += len(chunk)
                        pull._notify()
            finally:
                os.close(fd)
            got = digest.hexdigest()
            if pull.done != entry.size:
                raise upstream_mod.UpstreamError(502, f"{repo}@{sha}/{entry.path}: the upstream sent {pull.done} "
                                                      f"bytes, its listing says {entry.size}; discarded")
            if entry.sha256 and got != entry.sha256:
                raise upstream_mod.UpstreamError(502, f"{repo}@{sha}/{entry.path}: sha256 {got} does not match the "
                                                      f"upstream's {entry.sha256}; discarded")
            pull.final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(pull.tmp, pull.final)
            pull.verified = True
            if not entry.sha256:
                await asyncio.to_thread(self.store.record_sha256, repo, sha, entry.path, got)
            log.info("pulled %s@%s/%s (%d bytes) from %s", repo, sha, entry.path, pull.done, self.upstream.base_url)
        except Exception as e:
            pull.error = e.message if isinstance(e, upstream_mod.UpstreamError) else f"{entry.path}: {e!r}"
            log.warning("pull of %s@%s/%s failed: %s", repo, sha, entry.path, pull.error)
            try:
                os.unlink(pull.tmp)
            except FileNotFoundError:
                pass
        finally:
            # Renamed (or failed) and forgotten with no await between: the next asker finds the file on disk,
            # or starts a fresh download after a failure.
            self._files.pop((repo, sha, entry.path), None)
            pull.finished = True
            pull._notify()

    async def revision(self, repo: str, rev: str,
                       lookup: Callable[[], Awaitable[store_mod.Revision]]) -> store_mod.Revision:
        """``lookup()`` run once for a crowd asking for the same ``repo@rev``."""
        key = (repo, rev)
        task = self._revisions.get(key)
        if task is None:
            task = asyncio.create_task(lookup(), name=f"resolve {repo}@{rev}")
            self._revisions[key] = task
            task.add_done_callback(lambda _t: self._revisions.pop(key, None))
        return await asyncio.shield(task)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
