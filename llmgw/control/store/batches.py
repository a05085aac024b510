"""The store's OpenAI Files and Batches part (issue 32): files, batches, and each batch's lines claimed and answered.

Unfenced, as routers' usage is (``usage``): an upload, a batch created or cancelled, a line claimed or answered
are facts any control plane may store while a router or a client talks to it, during a failover too, not
decisions only the leader may take. Each write is conditional, so doing it twice does it once: a line's answer
is written only while the line is not done (``finish_lines``), a status moves only from the statuses it may
move from (``move_batch``). Claims take lines nobody holds, or whose holder's lease ran out, ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL so that two control planes never hand one line to two routers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from llmgw.control.store.base import StoreBase
from llmgw.control.store.batchtables import OaiBatchLineRow, OaiBatchRow, OaiFileChunkRow, OaiFileRow
from llmgw.control.store.tables import ApiKeyRow

#: Bytes per chunk row of a file stored in the database.
CHUNK = 1 << 20
#: Line rows per insert statement (11 values each, under SQLite's 32766 bound variables).
_LINES_PER_INSERT = 2000

# A line's answer and a line given back, as Core statements on the table, compiled once: the ORM's bulk update
# (evaluating each row's condition in Python) cost about 1 ms of the store thread's time per line, and that thread
# holds the GIL the router's event loop needs in the same process (``bench/batch_ttft.py``).
_LINE = OaiBatchLineRow.__table__.c
_FINISH = (sa.update(OaiBatchLineRow.__table__)
           .where(_LINE.batch_id == sa.bindparam("b_id"), _LINE.idx == sa.bindparam("b_idx"),
                  _LINE.state.in_(("pending", "claimed")))
           .values(state="done", status_code=sa.bindparam("b_status"), response=sa.bindparam("b_response"),
                   error=sa.bindparam("b_error"), claimed_by="", claim_until=0.0))
_RELEASE = (sa.update(OaiBatchLineRow.__table__)
            .where(_LINE.batch_id == sa.bindparam("b_id"), _LINE.idx == sa.bindparam("b_idx"),
                   _LINE.state == "claimed", _LINE.claimed_by == sa.bindparam("b_router"))
            .values(state="pending", claimed_by="", claim_until=0.0))


class QuotaExceeded(ValueError):
    """A project's files would pass its count or bytes quota; the message says which and what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    project: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    location: str  # "db" or "dir"


@dataclasses.dataclass(frozen=True, slots=True)
class StoredBatch:
    id: str
    project: str
    key_id: str
    user: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, Any] | None
    status: str
    created_at: float
    expires_at: float
    times: dict[str, float]
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class NewLine:
    """A line of a batch's input: valid (``body`` its request's JSON) or invalid (``error`` its JSON)."""

    idx: int
    custom_id: str | None
    model: str = ""
    body: str = ""
    error: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedLine:
    batch_id: str
    idx: int
    custom_id: str
    model: str
    body: str
    endpoint: str
    project: str
    key_id: str
    user: str


@dataclasses.dataclass(frozen=True, slots=True)
class LineResult:
    batch_id: str
    idx: int
    status_code: int
    response: str  # the answer's JSON text ("" when none came)
    error: str = ""  # ``{"code", "message"}`` JSON when the request could not be sent


@dataclasses.dataclass(frozen=True, slots=True)
class DoneLine:
    idx: int
    custom_id: str | None
    status_code: int
    response: str
    error: str


def _file(r: OaiFileRow) -> StoredFile:
    return StoredFile(r.id, r.project, r.purpose, r.filename, r.bytes, r.created_at, r.location)


def _batch(r: OaiBatchRow) -> StoredBatch:
    return StoredBatch(r.id, r.project, r.key_id, r.user, r.endpoint, r.input_file_id, r.completion_window, r.meta,
                       r.status, r.created_at, r.expires_at, dict(r.times or {}), r.output_file_id, r.error_file_id,
                       r.errors)


class BatchStore(StoreBase):
    """Files (their bytes in chunk rows when ``location`` is ``db``), batches and their lines."""

    def _begin(self) -> Any:
        return self._session.begin()

    def key_by_hash(self, sha256: str) -> tuple[str, str, str] | None | bool:
        """(id, project, user) of the enabled API key with that hash; None when none; False when no key exists
        at all (the OpenAI API is open then, as the routers' is)."""
        with self._session() as s:
            row = s.execute(sa.select(ApiKeyRow.id, ApiKeyRow.project, ApiKeyRow.user)
                            .where(ApiKeyRow.sha256 == sha256, ApiKeyRow.disabled.is_(False))).first()
            if row is not None:
                return (row[0], row[1], row[2])
            return None if s.scalar(sa.select(sa.func.count()).select_from(ApiKeyRow)) else False

    # -- files -------------------------------------------------------------------------------------------
    def add_file(self, f: StoredFile, data: bytes | None, *, max_files: int, max_bytes: int) -> StoredFile:
        """Stores ``f`` (and ``data`` in chunk rows when given); QuotaExceeded when the project's files would pass
        ``max_files`` or ``max_bytes`` (0: no limit)."""
        with self._begin() as s:
            if max_files or max_bytes:
                if s.bind.dialect.name == "postgresql":  # two uploads of one project counted one after the other
                    s.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext("oai_files:" + f.project))))
                count, total = s.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(OaiFileRow.bytes), 0))
                                         .where(OaiFileRow.project == f.project)).one()
                if max_files and count + 1 > max_files:
                    raise QuotaExceeded(f"project {f.project!r} has {count} files, its quota (--files-max-per-project);"
                                        " delete some with client.files.delete(...) first")
                if max_bytes and total + f.bytes > max_bytes:
                    raise QuotaExceeded(f"project {f.project!r} has {total} bytes in files and this one adds {f.bytes}"
                                        f", past its quota of {max_bytes} (--files-max-bytes-per-project); delete some "
                                        "with client.files.delete(...) first")
            s.add(OaiFileRow(id=f.id, project=f.project, purpose=f.purpose, filename=f.filename, bytes=f.bytes,
                             created_at=f.created_at, location=f.location))
            if data is not None:
                s.flush()
                for seq, at in enumerate(range(0, max(len(data), 1), CHUNK)):
                    s.add(OaiFileChunkRow(file_id=f.id, seq=seq, data=data[at:at + CHUNK]))
        return f

    def get_file(self, file_id: str) -> StoredFile | None:
        with self._session() as s:
            r = s.get(OaiFileRow, file_id)
            return None if r is None else _file(r)

    def file_chunks(self, file_id: str) -> Iterator[bytes]:
        """A ``db`` file's bytes, chunk by chunk."""
        seq = 0
        while True:
            with self._session() as s:
                data = s.scalar(sa.select(OaiFileChunkRow.data).where(OaiFileChunkRow.file_id == file_id,
                                                                       OaiFileChunkRow.seq == seq))
            if data is None:
                return
            yield bytes(data)
            seq += 1

    def list_files(self, project: str, *, purpose: str = "", after: str = "", limit: int = 10000,
                   ascending: bool = False) -> list[StoredFile]:
        with self._session() as s:
            q = sa.select(OaiFileRow).where(OaiFileRow.project == project)
            if purpose:
                q = q.where(OaiFileRow.purpose == purpose)
            order = (OaiFileRow.created_at, OaiFileRow.id)
            if after and (ref := s.get(OaiFileRow, after)) is not None:
                key = sa.tuple_(*order)
                q = q.where(key > (ref.created_at, ref.id) if ascending else key < (ref.created_at, ref.id))
            q = q.order_by(*(order if ascending else (c.desc() for c in order))).limit(limit)
            return [_file(r) for r in s.scalars(q)]

    def delete_file(self, project: str, file_id: str) -> StoredFile | None:
        """Deletes the project's file and its chunk rows; the file as it was, or None when it had none such."""
        with self._begin() as s:
            r = s.get(OaiFileRow, file_id)
            if r is None or r.project != project:
                return None
            gone = _file(r)
            s.execute(sa.delete(OaiFileChunkRow).where(OaiFileChunkRow.file_id == file_id))
            s.delete(r)
        return gone

    # -- batches -----------------------------------------------------------------------------------------
    def add_batch(self, b: StoredBatch, lines: Sequence[NewLine]) -> StoredBatch:
        with self._begin() as s:
            s.add(OaiBatchRow(id=b.id, project=b.project, key_id=b.key_id, user=b.user, endpoint=b.endpoint,
                              input_file_id=b.input_file_id, completion_window=b.completion_window, meta=b.metadata,
                              status=b.status, created_at=b.created_at, expires_at=b.expires_at, times=b.times))
            s.flush()
            rows = [dict(batch_id=b.id, idx=n.idx, custom_id=n.custom_id, model=n.model, body=n.body,
                         state="invalid" if n.error else "pending", claimed_by="", claim_until=0.0, status_code=0,
                         response="", error=n.error) for n in lines]
            for at in range(0, len(rows), _LINES_PER_INSERT):
                s.execute(sa.insert(OaiBatchLineRow), rows[at:at + _LINES_PER_INSERT])
        return b

    def get_batch(self, batch_id: str) -> StoredBatch | None:
        with self._session() as s:
            r = s.get(OaiBatchRow, batch_id)
            return None if r is None else _batch(r)

    def list_batches(self, project: str, *, after: str = "", limit: int = 20) -> list[StoredBatch]:
        """The project's batches, newest first, those after ``after`` (a batch id) when given."""
        with self._session() as s:
            q = sa.select(OaiBatchRow).where(OaiBatchRow.project == project)
            if after and (ref := s.get(OaiBatchRow, after)) is not None:
                q = q.where(sa.tuple_(OaiBatchRow.created_at, OaiBatchRow.id) < (ref.created_at, ref.id))
            q = q.order_by(OaiBatchRow.created_at.desc(), OaiBatchRow.id.desc()).limit(limit)
            return [_batch(r) for r in s.scalars(q)]

    def batches_in(self, statuses: Iterable[str]) -> list[StoredBatch]:
        with self._session() as s:
            return [_batch(r) for r in s.scalars(sa.select(OaiBatchRow).where(OaiBatchRow.status.in_(list(statuses)))
                                                 .order_by(OaiBatchRow.created_at))]

    def batch_counts(self, batch_ids: Sequence[str]) -> dict[str, tuple[int, int, int]]:
        """Per batch: (total, completed, failed) lines; completed: answered 200, failed: invalid or answered else."""
        if not batch_ids:
            return {}
        line = OaiBatchLineRow
        ok = sa.and_(line.state == "done", line.status_code == 200)
        bad = sa.or_(line.state == "invalid", sa.and_(line.state == "done", line.status_code != 200))
        with self._session() as s:
            rows = s.execute(sa.select(line.batch_id, sa.func.count(), sa.func.sum(sa.case((ok, 1), else_=0)),
                                       sa.func.sum(sa.case((bad, 1), else_=0)))
                             .where(line.batch_id.in_(list(batch_ids))).group_by(line.batch_id)).all()
        return {r[0]: (int(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in rows}

    def move_batch(self, batch_id: str, status: str, *, at: float, only_from: Iterable[str],
                   **fields: Any) -> StoredBatch | None:
        """Moves the batch to ``status`` (its time ``at`` recorded, ``fields`` set) if it is in one of ``only_from``;
        the batch as it is after, or None when it was not (moved already, or unknown)."""
        with self._begin() as s:
            q = sa.select(OaiBatchRow).where(OaiBatchRow.id == batch_id, OaiBatchRow.status.in_(list(only_from)))
            if s.bind.dialect.name == "postgresql":
                q = q.with_for_update()
            r = s.scalars(q).first()
            if r is None:
                return None
            r.status = status
            r.times = {**(r.times or {}), status: at}
            for name, value in fields.items():
                setattr(r, name, value)
            return _batch(r)

    # -- lines -------------------------------------------------------------------------------------------
    def claim_lines(self, router: str, models: Iterable[str], *, limit: int, now: float,
                    lease_s: float) -> list[ClaimedLine]:
        """Up to ``limit`` lines of in-progress batches for ``models``, held by ``router`` for ``lease_s``: lines
        nobody holds, or held past their lease (their router gone). Oldest batch first, in line order."""
        line, batch = OaiBatchLineRow, OaiBatchRow
        models = list(models)
        if not models or limit <= 0:
            return []
        pg = self.engine.dialect.name == "postgresql"
        out: list[ClaimedLine] = []
        with self._begin() as s:
            running = s.execute(sa.select(batch.id, batch.endpoint, batch.project, batch.key_id, batch.user)
                                .where(batch.status == "in_progress").order_by(batch.created_at, batch.id)).all()
            for batch_id, endpoint, project, key_id, user in running:
                want = limit - len(out)
                if want <= 0:
                    break
                found: list[Any] = []
                # Pending lines first (the index's order), then lines whose router's lease ran out.
                for cond in (line.state == "pending", sa.and_(line.state == "claimed", line.claim_until < now)):
                    q = (sa.select(line.idx, line.custom_id, line.model, line.body)
                         .where(line.batch_id == batch_id, cond, line.model.in_(models))
                         .order_by(line.idx).limit(want - len(found)))
                    if pg:
                        q = q.with_for_update(skip_locked=True)
                    found += s.execute(q).all()
                    if len(found) >= want:
                        break
                if not found:
                    continue
                s.execute(sa.update(OaiBatchLineRow.__table__)
                          .where(_LINE.batch_id == batch_id, _LINE.idx.in_([r[0] for r in found]))
                          .values(state="claimed", claimed_by=router, claim_until=now + lease_s))
                out += [ClaimedLine(batch_id, r[0], r[1] or "", r[2], r[3], endpoint, project, key_id, user)
                        for r in found]
        return out

    def finish_lines(self, results: Sequence[LineResult]) -> int:
        """Each line's answer written once: a line done already keeps its first answer. The number written."""
        written = 0
        with self._begin() as s:
            conn = s.connection()
            for r in results:  # one statement each: its rowcount says whether this answer was the first
                written += conn.execute(_FINISH, {"b_id": r.batch_id, "b_idx": r.idx, "b_status": r.status_code,
                                                  "b_response": r.response, "b_error": r.error}).rowcount
        return written

    def release_lines(self, router: str, lines: Sequence[tuple[str, int]]) -> int:
        """Lines ``router`` claimed and gives back unrun: pending again (a line done, or held by another, stays)."""
        n = 0
        with self._begin() as s:
            conn = s.connection()
            for batch_id, idx in lines:
                n += conn.execute(_RELEASE, {"b_id": batch_id, "b_idx": idx, "b_router": router}).rowcount
        return n

    def batch_statuses(self, batch_ids: Sequence[str]) -> dict[str, str]:
        with self._session() as s:
            return dict(s.execute(sa.select(OaiBatchRow.id, OaiBatchRow.status)
                                  .where(OaiBatchRow.id.in_(list(batch_ids)))).all()) if batch_ids else {}

    def lines_left(self, batch_id: str, *, now: float) -> tuple[int, int]:
        """(1 when any line is pending or claimed else 0, the lines held by a router whose lease has not run out):
        both read through the (batch, state) index, never every line of a large batch."""
        line = OaiBatchLineRow
        with self._session() as s:
            left = s.scalar(sa.select(line.idx).where(line.batch_id == batch_id, line.state == "pending").limit(1))
            held = s.scalar(sa.select(sa.func.count()).select_from(line).where(
                line.batch_id == batch_id, line.state == "claimed", line.claim_until >= now)) or 0
            if left is None:
                left = s.scalar(sa.select(line.idx).where(line.batch_id == batch_id, line.state == "claimed").limit(1))
        return int(left is not None), int(held)

    def finished_lines(self, batch_id: str, *, after: int = -1, limit: int = 5000) -> list[DoneLine]:
        """The batch's done and invalid lines in line order, from after line ``after``."""
        line = OaiBatchLineRow
        with self._session() as s:
            rows = s.execute(sa.select(line.idx, line.custom_id, line.status_code, line.response, line.error)
                             .where(line.batch_id == batch_id, line.state.in_(("done", "invalid")), line.idx > after)
                             .order_by(line.idx).limit(limit)).all()
        return [DoneLine(r[0], r[1], r[2], r[3], r[4]) for r in rows]


    def unfinished_lines(self, batch_id: str) -> list[tuple[int, str | None]]:
        """(line, custom_id) of the batch's lines never answered, in line order."""
        line = OaiBatchLineRow
        with self._session() as s:
            return [(r[0], r[1]) for r in s.execute(sa.select(line.idx, line.custom_id).where(
                line.batch_id == batch_id, line.state.in_(("pending", "claimed"))).order_by(line.idx)).all()]

