"""The store's two logs: the cluster's events (what happened to an object) and the audit log (who did what)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import sqlalchemy as sa

from llmgw.control.events import Event
from llmgw.control.store.base import StoreBase, db_text
from llmgw.control.store.tables import AuditRow, EventRow

#: Events kept; older ones are pruned as new ones are written, so the table never grows without bound.
EVENTS_KEPT = 10_000
#: How an audited action ended: done (2xx), refused as asked (4xx), or broken on our side (5xx).
AUDIT_OUTCOMES = ("ok", "refused", "failed")


@dataclasses.dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the audit log; ``detail`` says why it was refused or failed, never a secret or a body."""

    id: int
    at: float
    actor: str
    action: str
    object: str
    outcome: str
    detail: str = ""


def event_from_row(r: EventRow) -> Event:
    return Event(time=r.time, kind=r.kind, reason=r.reason, object=r.object, message=r.message, model=r.model,
                 node=r.node, id=r.id)


class HistoryStore(StoreBase):
    """Events, pruned to the newest ``EVENTS_KEPT``; audit entries, pruned to the retention."""

    # -- events --------------------------------------------------------------------
    def add_events(self, events: Iterable[Event], *, keep: int = EVENTS_KEPT) -> list[Event]:
        """Appends events (returned with their ids) and drops all but the newest ``keep``."""
        rows = [EventRow(time=e.time, kind=e.kind, reason=e.reason[:64], object=e.object[:320],
                         model=e.model[:63], node=e.node[:253], message=db_text(e.message)) for e in events]
        if not rows:
            return []
        with self._tx() as s:
            s.add_all(rows)
            s.flush()
            newest = rows[-1].id
            if newest > keep:
                s.execute(sa.delete(EventRow).where(EventRow.id <= newest - keep))
        return [event_from_row(r) for r in rows]

    def list_events(self, *, obj: str | None = None, model: str | None = None, node: str | None = None,
                    since: float | None = None, after_id: int = 0, limit: int = 500) -> list[Event]:
        """The newest ``limit`` events that match, oldest first; ``model``/``node`` include their replicas'."""
        # Columns, not ORM objects: a page of 500 built 500 mapped instances with their state to make
        # 500 Events, ~6 young collections a page. Under a client paging events those collections ran
        # 90-190 times a second and promoted every agent stream's in-flight read (agentsvc/collector).
        # In ``Event``'s field order, for ``Event(*row)``.
        q = sa.select(EventRow.time, EventRow.kind, EventRow.reason, EventRow.object, EventRow.message,
                      EventRow.model, EventRow.node, EventRow.id).where(EventRow.id > after_id)
        if obj:
            q = q.where(EventRow.object == obj)
        if model:
            q = q.where(sa.or_(EventRow.model == model, EventRow.object == f"model/{model}"))
        if node:
            q = q.where(sa.or_(EventRow.node == node, EventRow.object == f"node/{node}"))
        if since is not None:
            q = q.where(EventRow.time >= since)
        with self._session() as s:
            rows = s.execute(q.order_by(EventRow.id.desc()).limit(limit)).all()
        return [Event(*r) for r in reversed(rows)]

    # -- the audit log -----------------------------------------------------------------
    def record_audit(self, *, actor: str, action: str, object: str, outcome: str, detail: str = "",
                     at: float | None = None) -> AuditEntry:
        """Appends one action to the audit log; returns it with its id. Kept for the retention (``prune_audit``)."""
        if outcome not in AUDIT_OUTCOMES:
            raise ValueError(f"audit outcome {outcome!r}: expected one of {', '.join(AUDIT_OUTCOMES)}")
        row = AuditRow(at=time.time() if at is None else at, actor=actor[:320], action=action[:32],
                       object=object[:320], outcome=outcome, detail=db_text(detail[:2000]))
        with self._append_tx() as s:  # a deposed leader still records what it did under its lease
            s.add(row)
            s.flush()
            return AuditEntry(row.id, row.at, row.actor, row.action, row.object, row.outcome, row.detail)

    def set_audit_detail(self, entry_id: int, detail: str) -> None:
        """Rewrites one entry's detail: a row that counts refusals (``http.audit.RefusalCounts``) as they come."""
        with self._tx() as s:
            s.execute(sa.update(AuditRow).where(AuditRow.id == entry_id).values(detail=db_text(detail[:2000])))

    def prune_audit(self, *, before: float) -> int:
        """Deletes the entries older than ``before`` (the retention, ``llmgw server --audit-retention``)."""
        with self._tx() as s:
            return int(s.execute(sa.delete(AuditRow).where(AuditRow.at < before)).rowcount)

    def list_audit(self, *, since_id: int = 0, limit: int = 500) -> list[AuditEntry]:
        """Up to ``limit`` entries after ``since_id``, oldest first (``since_id=0``: from the start)."""
        q = (sa.select(AuditRow.id, AuditRow.at, AuditRow.actor, AuditRow.action, AuditRow.object,
                       AuditRow.outcome, AuditRow.detail)
             .where(AuditRow.id > since_id).order_by(AuditRow.id).limit(limit))
        with self._session() as s:
            return [AuditEntry(*r) for r in s.execute(q).all()]
