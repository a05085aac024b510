"""The store's models, replicas and their conditions: what runs where, as the control loop last wrote it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import defer

from llmgw.control.conditions import Condition
from llmgw.control.state import Member, Phase, ReplicaRecord
from llmgw.control.store.base import StoreBase, db_text
from llmgw.control.store.tables import ModelRow, ReplicaRow
from llmgw.core import specs


@dataclasses.dataclass(frozen=True, slots=True)
class StoredModel:
    model: specs.Model
    generation: int
    created_at: float
    updated_at: float


def replica_from_row(row: Any) -> ReplicaRecord:
    """A record from a row of the replicas table's columns (``conditions`` not needed): a plain row or a ReplicaRow."""
    return ReplicaRecord(
        id=row.id, model=row.model, fingerprint=row.fingerprint, phase=Phase(row.phase), api_key=row.api_key,
        node_id=row.node_id, shard_id=row.shard_id, attempt=row.attempt, failures=row.failures,
        next_attempt_at=row.next_attempt_at, started_at=row.started_at, sent_at=row.sent_at,
        ready_at=row.ready_at, endpoint=row.endpoint, message=row.message,
        last_output=tuple(row.last_output or ()), created_at=row.created_at,
        gpus=tuple(int(g) for g in (row.gpus or ())), memory_bytes=int(row.memory_bytes or 0),
        memory_estimated=bool(row.memory_estimated),
        members=tuple(_member_from_doc(m) for m in (row.members or ())),
        leader_addr=row.leader_addr or "", leader_port=int(row.leader_port or 0),
    )


def _member_to_doc(m: Member) -> dict[str, Any]:
    return {"rank": m.rank, "node_id": m.node_id, "shard_id": m.shard_id, "gpus": list(m.gpus),
            "hcas": list(m.hcas)}


def _member_from_doc(doc: dict[str, Any]) -> Member:
    return Member(rank=int(doc["rank"]), node_id=str(doc["node_id"]), shard_id=str(doc["shard_id"]),
                  gpus=tuple(int(g) for g in doc.get("gpus", ())), hcas=tuple(str(h) for h in doc.get("hcas", ())))


def _fill_replica_row(row: ReplicaRow, r: ReplicaRecord, now: float) -> None:
    row.model, row.fingerprint, row.phase, row.api_key = r.model, r.fingerprint, r.phase.value, r.api_key
    row.node_id, row.shard_id, row.attempt, row.failures = r.node_id, r.shard_id, r.attempt, r.failures
    row.next_attempt_at, row.started_at, row.sent_at = r.next_attempt_at, r.started_at, r.sent_at
    row.ready_at, row.endpoint, row.message = r.ready_at, db_text(r.endpoint), db_text(r.message)
    row.last_output, row.updated_at = list(r.last_output), now
    row.gpus, row.memory_bytes, row.memory_estimated = list(r.gpus), r.memory_bytes, r.memory_estimated
    row.members = [_member_to_doc(m) for m in r.members]
    row.leader_addr, row.leader_port = r.leader_addr, r.leader_port


def _conds(docs: Any) -> tuple[Condition, ...]:
    return tuple(Condition.from_doc(d) for d in (docs or ()))


class WorkloadStore(StoreBase):
    """Models (their manifests, generation and conditions) and replica targets."""

    # -- models ------------------------------------------------------------------
    def put_model(self, model: specs.Model, *, now: float | None = None) -> tuple[StoredModel, bool]:
        """Creates or replaces a model; returns it and whether it was new."""
        now = time.time() if now is None else now
        with self._tx() as s:
            row = s.get(ModelRow, model.name)
            created = row is None
            if row is None:
                row = ModelRow(name=model.name, manifest=model.to_manifest(), generation=1,
                               created_at=now, updated_at=now)
                s.add(row)
            elif row.manifest != model.to_manifest():
                row.manifest, row.generation, row.updated_at = model.to_manifest(), row.generation + 1, now
            return self._stored_model(row), created

    def _stored_model(self, row: ModelRow) -> StoredModel:
        return StoredModel(specs.parse_manifest(row.manifest, stored=True), row.generation, row.created_at,
                           row.updated_at)

    def get_model(self, name: str) -> StoredModel | None:
        with self._session() as s:
            row = s.get(ModelRow, name)
            return self._stored_model(row) if row else None

    def list_models(self) -> list[StoredModel]:
        with self._session() as s:
            q = sa.select(ModelRow).options(defer(ModelRow.conditions)).order_by(ModelRow.name)
            return [self._stored_model(r) for r in s.scalars(q)]

    def delete_model(self, name: str) -> bool:
        with self._tx() as s:
            row = s.get(ModelRow, name)
            if row is None:
                return False
            s.delete(row)
            return True

    # -- replicas ----------------------------------------------------------------
    def list_replicas(self) -> list[ReplicaRecord]:
        with self._session() as s:
            # Conditions are not part of a ReplicaRecord; decoding their JSON was the largest part of
            # this call, made every pass and on every `llmgw get replicas` (py-spy, bench/control_load.py).
            # Plain rows of the columns, not ORM objects: building their identity state and reading each
            # attribute through its descriptor was 0.12 s of 0.30 s for 2,000 replicas, every pass.
            cols = [c for c in ReplicaRow.__table__.columns if c.name != "conditions"]
            rows = s.execute(sa.select(*cols).order_by(ReplicaRow.created_at, ReplicaRow.id)).all()
            return [replica_from_row(r) for r in rows]

    def list_replica_states(self) -> list[ReplicaRecord]:
        """Every replica as far as a model's status reads it (``status.summarize``): for summaries only, never
        for a decision or a write (fingerprint and key are empty; a record written back would lose its key).

        A Ready replica is counted by the database, not read: each stands as its model's one shared Ready
        record (id empty), since a status reads only its phase. The others are read with the seven fields
        their sentence needs (id, phase, node, failures, message and two times), oldest first. The models
        list read every whole replica, JSON columns and all, to count them: 0.19 s with 2,000 replicas
        (bench/ui_overview.py), every 2 s for each open overview.
        """
        ready = Phase.READY.value
        cols = (ReplicaRow.id, ReplicaRow.model, ReplicaRow.phase, ReplicaRow.node_id, ReplicaRow.failures,
                ReplicaRow.message, ReplicaRow.started_at, ReplicaRow.next_attempt_at)
        with self._session() as s:
            counts = s.execute(sa.select(ReplicaRow.model, sa.func.count()).where(ReplicaRow.phase == ready)
                               .group_by(ReplicaRow.model)).all()
            rows = s.execute(sa.select(*cols).where(ReplicaRow.phase != ready)
                             .order_by(ReplicaRow.created_at, ReplicaRow.id)).all()
        out = [ReplicaRecord(id=r.id, model=r.model, fingerprint="", phase=Phase(r.phase), api_key="",
                             node_id=r.node_id, failures=r.failures, message=r.message, started_at=r.started_at,
                             next_attempt_at=r.next_attempt_at) for r in rows]
        for model, n in counts:
            out += [ReplicaRecord(id="", model=model, fingerprint="", phase=Phase.READY, api_key="")] * int(n)
        return out

    def write_replicas(self, *, upserts: Iterable[ReplicaRecord] = (), deletes: Iterable[str] = (),
                       now: float | None = None) -> None:
        """Writes replica targets in one transaction."""
        now = time.time() if now is None else now
        with self._tx() as s:
            for r in upserts:
                row = s.get(ReplicaRow, r.id)
                if row is None:
                    row = ReplicaRow(id=r.id, created_at=r.created_at or now)
                    s.add(row)
                _fill_replica_row(row, r, now)
            for rid in deletes:
                row = s.get(ReplicaRow, rid)
                if row is not None:
                    s.delete(row)

    # -- conditions ----------------------------------------------------------------
    def conditions(self) -> tuple[dict[str, tuple[Condition, ...]], dict[str, tuple[Condition, ...]]]:
        """(replica id -> its conditions, model name -> its conditions), as last written."""
        with self._session() as s:
            reps = {rid: _conds(docs) for rid, docs in s.execute(sa.select(ReplicaRow.id, ReplicaRow.conditions))}
            models = {name: _conds(docs) for name, docs in s.execute(sa.select(ModelRow.name, ModelRow.conditions))}
        return reps, models

    def set_conditions(self, *, replicas: dict[str, tuple[Condition, ...]] | None = None,
                       models: dict[str, tuple[Condition, ...]] | None = None) -> None:
        """Writes conditions of existing replicas and models (a row deleted meanwhile is skipped)."""
        with self._tx() as s:
            for rid, conds in (replicas or {}).items():
                row = s.get(ReplicaRow, rid)
                if row is not None:
                    row.conditions = [c.to_doc() for c in conds]
            for name, conds in (models or {}).items():
                mrow = s.get(ModelRow, name)
                if mrow is not None:
                    mrow.conditions = [c.to_doc() for c in conds]
