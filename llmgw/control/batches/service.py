"""``BatchService``: OpenAI files and batches over the store, the routers' claims and results, and the leader's step.

A batch's life (OpenAI's statuses): created ``validating`` with its lines read (``inputs``); the leader's
``step`` moves it to ``in_progress``, where routers claim its lines (``claim``) and post their answers
(``results``); when no line is left it is ``finalizing`` while the output file (answers of status 200) and the
error file (invalid lines, other statuses) are written, then ``completed``. ``cancel`` makes it ``cancelling``:
routers are told to give back what they hold unrun, and once nothing is held it is ``cancelled`` with the files
of what was done. Past its ``completion_window`` it is ``expired`` the same way, the lines never run in its error
file as ``batch_expired``. Every write is conditional (``store.batches``), so two control planes, or a new
leader after a failover, doing a step twice do it once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from llmgw.api import batches as wire
from llmgw.control.batches import blobs, inputs
from llmgw.control.batches.config import FilesConfig
from llmgw.control.batches.objects import BatchObject, batch_object
from llmgw.control.store.batches import LineResult, QuotaExceeded, StoredBatch, StoredFile
from llmgw.control.store.offloop import StoreThread

log = logging.getLogger(__name__)
WINDOWS = {"24h": 86400.0}
PURPOSES = ("batch",)
_DONE_OUT = ("completed", "cancelled", "expired", "failed")


class Refused(Exception):
    """What the API answers instead: ``status`` with OpenAI's error object."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type

    def doc(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class BatchService:
    def __init__(self, db: StoreThread, config: FilesConfig = FilesConfig(), *,
                 clock: Callable[[], float] = time.time) -> None:
        self.db, self.config, self._clock = db, config, clock
        self._store = db.store

    # -- files -------------------------------------------------------------------------------------------
    async def upload(self, project: str, filename: str, purpose: str, data: bytes) -> StoredFile:
        if purpose not in PURPOSES:
            raise Refused(400, f"purpose {purpose!r} is not one llmgw stores: upload with purpose=\"batch\"",
                          code="invalid_purpose", param="purpose")
        if len(data) > self.config.max_file_bytes:
            raise Refused(413, f"the file is {len(data)} bytes, past the limit of {self.config.max_file_bytes} "
                               "(--files-max-bytes); split it into several batches", code="file_too_large",
                          param="file")
        return await self._put(project, filename[:255] or "upload.jsonl", purpose, data, quota=True)

    async def _put(self, project: str, filename: str, purpose: str, data: bytes, *, quota: bool) -> StoredFile:
        directory = self.config.dir
        f = StoredFile(_id("file-"), project, purpose, filename, len(data), self._clock(), blobs.location(directory))
        if directory is not None:
            await asyncio.to_thread(blobs.write, directory, f.id, data)
        try:
            return await self.db.call(self._store.add_file, f, None if directory is not None else data,
                                      max_files=self.config.max_files_per_project if quota else 0,
                                      max_bytes=self.config.max_bytes_per_project if quota else 0)
        except QuotaExceeded as exc:
            blobs.remove(directory, f)
            raise Refused(429, str(exc), code="quota_exceeded", type="rate_limit_exceeded") from None

    async def get_file(self, project: str, file_id: str) -> StoredFile:
        f = await self.db.call(self._store.get_file, file_id)
        if f is None or f.project != project:
            raise Refused(404, f"No such File object: {file_id}", code="not_found", param="file_id")
        return f

    async def list_files(self, project: str, *, purpose: str, after: str, limit: int,
                         ascending: bool) -> list[StoredFile]:
        return await self.db.call(self._store.list_files, project, purpose=purpose, after=after, limit=limit,
                                  ascending=ascending)

    async def content(self, project: str, file_id: str) -> bytes:
        f = await self.get_file(project, file_id)
        return await self.db.call(blobs.read, self._store, self.config.dir, f)

    async def delete_file(self, project: str, file_id: str) -> str:
        gone = await self.db.call(self._store.delete_file, project, file_id)
        if gone is None:
            raise Refused(404, f"No such File object: {file_id}", code="not_found", param="file_id")
        blobs.remove(self.config.dir, gone)
        return gone.id

    # -- batches -----------------------------------------------------------------------------------------
    async def create(self, project: str, key_id: str, user: str, doc: Any) -> BatchObject:
        if not isinstance(doc, dict):
            raise Refused(400, "the body must be a JSON object", code="invalid_request")
        endpoint, window = doc.get("endpoint"), doc.get("completion_window")
        if endpoint not in inputs.ENDPOINTS:
            raise Refused(400, f"endpoint {endpoint!r} is not one a batch runs: {', '.join(inputs.ENDPOINTS)}",
                          code="invalid_value", param="endpoint")
        if window not in WINDOWS:
            raise Refused(400, f"completion_window {window!r} is not supported: use \"24h\"", code="invalid_value",
                          param="completion_window")
        metadata = doc.get("metadata")
        if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16 or not all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items())):
            raise Refused(400, "metadata must be at most 16 string pairs (keys up to 64 characters, values up to "
                               "512)", code="invalid_value", param="metadata")
        file_id = doc.get("input_file_id")
        if not isinstance(file_id, str):
            raise Refused(400, "input_file_id must name a file uploaded with purpose=\"batch\"",
                          code="invalid_value", param="input_file_id")
        f = await self.get_file(project, file_id)
        if f.purpose != "batch":
            raise Refused(400, f"file {file_id} has purpose {f.purpose!r}; a batch's input is uploaded with "
                               "purpose=\"batch\"", code="invalid_value", param="input_file_id")
        data = await self.db.call(blobs.read, self._store, self.config.dir, f)
        lines = await asyncio.to_thread(inputs.read_lines, data, endpoint)
        if len(lines) > self.config.max_lines:
            raise Refused(400, f"the file has {len(lines)} lines, past the {self.config.max_lines} one batch may "
                               "have (--batch-max-lines); split it", code="too_many_lines", param="input_file_id")
        now = self._clock()
        batch = StoredBatch(_id("batch_"), project, key_id, user, endpoint, file_id, window, metadata, "validating",
                            now, now + WINDOWS[window], {"validating": now})
        await self.db.call(self._store.add_batch, batch, lines)
        return batch_object(batch, (len(lines), 0, sum(1 for n in lines if n.error)))

    async def get(self, project: str, batch_id: str) -> BatchObject:
        b = await self.db.call(self._store.get_batch, batch_id)
        if b is None or b.project != project:
            raise Refused(404, f"No such Batch object: {batch_id}", code="not_found", param="batch_id")
        counts = await self.db.call(self._store.batch_counts, [b.id])
        return batch_object(b, counts.get(b.id, (0, 0, 0)))

    async def list(self, project: str, *, after: str, limit: int) -> tuple[list[BatchObject], bool]:
        found = await self.db.call(self._store.list_batches, project, after=after, limit=limit + 1)
        counts = await self.db.call(self._store.batch_counts, [b.id for b in found[:limit]])
        return [batch_object(b, counts.get(b.id, (0, 0, 0))) for b in found[:limit]], len(found) > limit

    async def cancel(self, project: str, batch_id: str) -> BatchObject:
        await self.get(project, batch_id)
        moved = await self.db.call(self._store.move_batch, batch_id, "cancelling", at=self._clock(),
                                   only_from=("validating", "in_progress"))
        if moved is None:
            b = await self.get(project, batch_id)
            if b.status not in ("cancelling", "cancelled"):
                raise Refused(409, f"batch {batch_id} is {b.status} and cannot be cancelled", code="invalid_state")
        return await self.get(project, batch_id)

    # -- routers -----------------------------------------------------------------------------------------
    async def claim(self, claim: wire.LineClaim) -> wire.ClaimedLines:
        lines = await self.db.call(self._store.claim_lines, claim.router, claim.models, limit=claim.max_lines,
                                   now=self._clock(), lease_s=self.config.lease_s)
        return wire.ClaimedLines(tuple(wire.Line(c.batch_id, c.idx, c.custom_id, c.model, c.endpoint, c.body, c.project,
                                                 c.key_id, c.user) for c in lines), self.config.lease_s)

    async def results(self, doc: wire.LineResults) -> wire.ResultsAck:
        written = 0
        if doc.results:
            written = await self.db.call(self._store.finish_lines,
                                         [LineResult(r.batch, r.idx, r.status_code, r.response, r.error)
                                          for r in doc.results])
        if doc.released:
            await self.db.call(self._store.release_lines, doc.router, doc.released)
        statuses = await self.db.call(self._store.batch_statuses, list(doc.holding))
        return wire.ResultsAck(written, tuple(b for b in doc.holding if statuses.get(b, "gone") != "in_progress"))

    # -- the leader's step ---------------------------------------------------------------------------------
    async def step(self) -> None:
        """One pass over the batches not finished: each moved on when it may be."""
        now = self._clock()
        for b in await self.db.call(self._store.batches_in, ("validating", "in_progress", "finalizing", "cancelling")):
            try:
                await self._step_one(b, now)
            except Exception:  # one batch's trouble stops no other
                log.exception("batch %s could not be moved on; retried next pass", b.id)

    async def _step_one(self, b: StoredBatch, now: float) -> None:
        store = self._store
        if b.status == "validating":
            await self.db.call(store.move_batch, b.id, "in_progress", at=now, only_from=("validating",))
            return
        if b.status == "in_progress":
            left, _ = await self.db.call(store.lines_left, b.id, now=now)
            if left == 0:
                if await self.db.call(store.move_batch, b.id, "finalizing", at=now, only_from=("in_progress",)):
                    await self._finish(b, "completed")
            elif now >= b.expires_at:
                await self.db.call(store.move_batch, b.id, "cancelling", at=now, only_from=("in_progress",),
                                   times={**b.times, "expiring": now})
            return
        if b.status == "finalizing":  # a leader stopped mid-way: written again, from the lines
            await self._finish(b, "completed")
        elif b.status == "cancelling":
            _, held = await self.db.call(store.lines_left, b.id, now=now)
            if held == 0:
                await self._finish(b, "expired" if "expiring" in b.times else "cancelled")

    async def _finish(self, b: StoredBatch, final: str) -> None:
        """The output and error files written from the batch's lines, and the batch moved to ``final``."""
        out, err = await self.db.call(self._files_of, b, final == "expired")
        output = await self._put(b.project, f"{b.id}_output.jsonl", "batch_output", out, quota=False) if out else None
        error = await self._put(b.project, f"{b.id}_error.jsonl", "batch_output", err, quota=False) if err else None
        moved = await self.db.call(self._store.move_batch, b.id, final, at=self._clock(),
                                   only_from=("finalizing", "cancelling"),
                                   output_file_id=output.id if output else None,
                                   error_file_id=error.id if error else None)
        if moved is None:  # another control plane finished it first: ours are extra copies
            for f in (output, error):
                if f is not None:
                    await self.delete_file(b.project, f.id)

    def _files_of(self, b: StoredBatch, expired: bool) -> tuple[bytes, bytes]:
        out: list[bytes] = []
        err: list[bytes] = []
        after = -1
        while page := self._store.finished_lines(b.id, after=after):
            for line in page:
                entry = _entry(b.id, line.idx, line.custom_id, line.status_code, line.response, line.error)
                (out if line.status_code == 200 and not line.error else err).append(entry)
            after = page[-1].idx
        if expired:
            for line in self._store.unfinished_lines(b.id):
                err.append(_entry(b.id, line[0], line[1], 0, "", json.dumps(
                    {"code": "batch_expired", "message": "This request could not be executed before the completion "
                                                         "window expired."})))
        return b"".join(out), b"".join(err)

    async def run(self, leading: Callable[[], bool], *, interval_s: float = 0.5) -> None:
        """``step`` every ``interval_s`` while this control plane leads (forever; cancel to stop)."""
        while True:
            if leading():
                try:
                    await self.step()
                except Exception:
                    log.exception("the batches' step failed; retried in %.1f s", interval_s)
            await asyncio.sleep(interval_s)


def _entry(batch_id: str, idx: int, custom_id: str | None, status: int, response: str, error: str) -> bytes:
    body: Any = None
    if response:
        try:
            body = json.loads(response)
        except ValueError:
            body = response
    doc = {"id": f"batch_req_{batch_id.removeprefix('batch_')}_{idx}", "custom_id": custom_id,
           "response": {"status_code": status, "request_id": f"{batch_id}-{idx}", "body": body} if status else None,
           "error": json.loads(error) if error else None}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"
