"""The store's cluster-wide state beyond models: engine wants, settings, and the autoscaler's state."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import sqlalchemy as sa

from llmgw.control.reconcile.engines import ScopedWant
from llmgw.control.store import schemafloor
from llmgw.control.store.base import StoreBase, db_text
from llmgw.control.store.tables import AutoscaleRow, EngineWantRow, SettingRow


@dataclasses.dataclass(frozen=True, slots=True)
class StoredAutoscale:
    """One autoscaled model's autoscaler state as stored (``core.autoscale.State``'s fields, and the last reason)."""

    model: str
    replicas: int
    above_since: float | None = None
    below_since: float | None = None
    idle_since: float | None = None
    last_scale_up_at: float = 0.0
    last_change_at: float = 0.0
    #: The sentence of the last change of count; "" before the first.
    last_reason: str = ""


class ClusterwideStore(StoreBase):
    """Engine versions wanted per scope, the key/value settings, and each autoscaled model's state."""

    # -- engine wants and cluster settings (issue 14) -------------------------------------
    def list_engine_wants(self) -> list[ScopedWant]:
        q = sa.select(EngineWantRow).order_by(EngineWantRow.scope, EngineWantRow.engine, EngineWantRow.version)
        with self._session() as s:
            return [ScopedWant(r.scope, r.engine, r.version, r.created_at) for r in s.scalars(q)]

    def add_engine_want(self, want: ScopedWant) -> bool:
        """Stores a want; False when it was already there (nothing changes then)."""
        with self._tx() as s:
            if s.get(EngineWantRow, (want.scope, want.engine, want.version)) is not None:
                return False
            s.add(EngineWantRow(scope=want.scope, engine=want.engine, version=want.version,
                                created_at=want.created_at))
            return True

    def delete_engine_want(self, scope: str, engine: str, version: str) -> bool:
        with self._tx() as s:
            return bool(s.execute(sa.delete(EngineWantRow).where(
                EngineWantRow.scope == scope, EngineWantRow.engine == engine,
                EngineWantRow.version == version)).rowcount)

    def settings(self) -> dict[str, str]:
        """The key/value settings, but the schema's record (``schemafloor.KEYS``), which is the migrations'."""
        with self._session() as s:
            return {r.key: r.value for r in s.scalars(sa.select(SettingRow).where(
                SettingRow.key.not_in(schemafloor.KEYS)))}

    def put_settings(self, values: dict[str, str]) -> None:
        with self._tx() as s:
            for key, value in values.items():
                s.merge(SettingRow(key=key, value=value))

    # -- the autoscaler's state (issue 17) ---------------------------------------------------
    def autoscale_states(self) -> dict[str, StoredAutoscale]:
        """Every autoscaled model's stored state, by model name."""
        with self._session() as s:
            return {r.model: StoredAutoscale(r.model, r.replicas, r.above_since, r.below_since, r.idle_since,
                                             r.last_scale_up_at, r.last_change_at, r.last_reason or "")
                    for r in s.scalars(sa.select(AutoscaleRow))}

    def write_autoscale(self, *, upserts: Iterable[StoredAutoscale] = (), deletes: Iterable[str] = ()) -> None:
        """Writes autoscaler states in one fenced transaction (only the leader scales)."""
        with self._tx() as s:
            for a in upserts:
                row = s.get(AutoscaleRow, a.model)
                if row is None:
                    row = AutoscaleRow(model=a.model)
                    s.add(row)
                row.replicas, row.above_since, row.below_since = a.replicas, a.above_since, a.below_since
                row.idle_since, row.last_scale_up_at = a.idle_since, a.last_scale_up_at
                row.last_change_at, row.last_reason = a.last_change_at, db_text(a.last_reason)
            for name in deletes:
                row = s.get(AutoscaleRow, name)
                if row is not None:
                    s.delete(row)

    # -- the leader lease (issue 15) -----------------------------------------------------
