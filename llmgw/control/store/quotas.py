"""The store's quota ledger: per budget what was charged and what each router holds, granted in one transaction.

``core.quota`` states the algorithm and its bound; this is where it holds across routers and control
planes. One ``quota_sync`` is one transaction: each budget's ledger row is locked (FOR UPDATE on
PostgreSQL; SQLite takes one writer at a time, and the first statement is a write so a second writer
waits instead of failing), its leases read, the leases of routers that stopped syncing charged, this
router's consumed and returned units applied, and a grant taken only out of what is free. So
``charged + Σ held <= limit`` after every grant, whichever control plane answers whichever router.
Budgets are visited in one order (sorted), so two syncs over the same budgets never deadlock.

A concurrency budget has no period and no charge: its slots are held while requests run and given
back when they end; a dead router's slots are freed when its lease expires (never charged, or the
limit would shrink for good).

Unfenced, like the usage rollups: any control plane answers routers, so a failover stops no request.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from llmgw.api.usage import QuotaGrant, QuotaItem
from llmgw.control.store.base import StoreBase
from llmgw.control.store.tables import ApiKeyRow, AuditRow, EventRow, ProjectRow
from llmgw.control.store.usage import _insert, locked_retry
from llmgw.control.store.usagetables import QuotaLeaseRow, QuotaLedgerRow
from llmgw.core import quota

log = logging.getLogger(__name__)
#: Ledger rows per statement.
_CHUNK = 500
#: Ledger rows are kept this long past their period's end (a late sync still finds them), then pruned.
LEDGER_KEPT_S = 86400.0


@dataclasses.dataclass(frozen=True, slots=True)
class Crossing:
    """A budget that passed one of ``core.quota.THRESHOLDS`` in this sync: announced once a period."""

    budget: str
    scope: str
    kind: str
    percent: int
    limit: int
    charged: int
    reset_at: float

    @property
    def object(self) -> str:
        """The event's object: ``key/ID`` or ``project/NAME``."""
        return self.scope.replace(":", "/", 1)

    def message(self) -> str:
        spend = self.kind == quota.SPEND_KIND
        used = f"{self.charged / quota.MICROS:.2f} of {self.limit / quota.MICROS:.2f}" if spend \
            else f"{self.charged} of {self.limit}"
        reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.reset_at))
        return f"{self.scope} reached {self.percent}% of its {self.kind} budget: {used} used; it resets at {reset}"


@dataclasses.dataclass(frozen=True, slots=True)
class Synced:
    grants: tuple[QuotaGrant, ...]
    crossings: tuple[Crossing, ...] = ()


LimitsOf = Callable[[str, str], int]


class QuotaStore(StoreBase):
    """The quota ledger and leases (``core.quota`` states the algorithm)."""

    def quota_sync(self, router_id: str, items: Sequence[QuotaItem], limits_of: LimitsOf, *, now: float) -> Synced:
        """Applies one router's sync and answers it, item for item in the order asked.

        ``limits_of(scope, kind)`` is the budget's limit in its units as the store's key or project says
        now (0: not in force, answered ``limit: 0`` and the router's lease dropped). An item whose budget
        is not one raises ``core.quota.BadLimits`` naming it (nothing applied).
        """
        parsed = [(i, item, *quota.parse_budget(item.budget)) for i, item in enumerate(items)]
        return locked_retry(lambda: self._sync(router_id[:253], parsed, limits_of, now))

    def _sync(self, router_id: str, parsed: list[tuple[int, QuotaItem, str, str, str]], limits_of: LimitsOf,
              now: float) -> Synced:
        answers: dict[int, QuotaGrant] = {}
        crossings: list[Crossing] = []
        budgets = sorted({p[1].budget for p in parsed})
        fresh = sorted({(p[1].budget, p[3]) for p in parsed if p[4] == quota.period(p[3], now).id})
        with self._session.begin() as s:
            # Every ledger row made where missing (sorted) before any is locked (sorted), as the usage
            # rollups are (``usage._add_rollups`` says why); the first statement a write, for SQLite.
            if fresh:
                for at in range(0, len(fresh), _CHUNK):
                    s.execute(_insert(s)(QuotaLedgerRow).on_conflict_do_nothing(), [
                        dict(budget=b, limit=0, charged=0, period_end=quota.period(kind, now).end, marks=0,
                             updated_at=now) for b, kind in fresh[at:at + _CHUNK]])
            else:  # only periods gone by: their rows are only ever updated
                s.execute(sa.update(QuotaLedgerRow).where(QuotaLedgerRow.budget.in_(budgets[:_CHUNK]))
                          .values(updated_at=now))
            ledgers: dict[str, QuotaLedgerRow] = {}
            leases: dict[str, dict[str, QuotaLeaseRow]] = {b: {} for b in budgets}
            for at in range(0, len(budgets), _CHUNK):
                chunk = budgets[at:at + _CHUNK]
                ledgers.update((r.budget, r) for r in s.scalars(
                    sa.select(QuotaLedgerRow).where(QuotaLedgerRow.budget.in_(chunk))
                    .order_by(QuotaLedgerRow.budget).with_for_update()))
                for lease in s.scalars(sa.select(QuotaLeaseRow).where(QuotaLeaseRow.budget.in_(chunk))
                                       .order_by(QuotaLeaseRow.budget, QuotaLeaseRow.router).with_for_update()):
                    leases[lease.budget][lease.router] = lease
            for i, item, scope, kind, period_id in sorted(parsed, key=lambda p: p[1].budget):
                limit = max(0, int(limits_of(scope, kind)))
                answers[i] = self._sync_one(s, router_id, item, scope, kind, period_id, limit, now, crossings,
                                            ledgers.get(item.budget), leases[item.budget])
        return Synced(tuple(answers[i] for i in range(len(parsed))), tuple(crossings))

    def _sync_one(self, s: Session, router_id: str, item: QuotaItem, scope: str, kind: str, period_id: str,
                  limit: int, now: float, crossings: list[Crossing], ledger: QuotaLedgerRow | None,
                  held_by: dict[str, QuotaLeaseRow]) -> QuotaGrant:
        """One item, on its budget's locked ledger row and leases (``held_by``, kept up to date for an item
        of the same budget later in the sync)."""
        current = quota.period(kind, now)
        budget = item.budget
        concurrency = kind == quota.CONCURRENCY_KIND
        leases = {r: lease for r, lease in held_by.items() if r != router_id}
        mine = held_by.pop(router_id, None)
        if ledger is None:  # a past period nobody keeps any more: nothing to apply or grant
            if mine is not None:
                s.delete(mine)
            return QuotaGrant(budget, 0, 0, limit, 0, limit, current.end)
        charged_before = ledger.charged
        # A router silent past its lease's life stopped (kill -9, cut off): what it held is charged.
        for other in [r for r in leases.values() if r.expires_at < now]:
            if not concurrency:
                ledger.charged += other.held
            s.delete(other)
            del leases[other.router], held_by[other.router]
        held = mine.held if mine is not None else 0
        if not concurrency:
            # Consumed beyond what it held is charged all the same: the overshoot the bound allows.
            ledger.charged += item.consumed
            held -= min(held, item.consumed)
        held -= min(held, item.returned)
        in_force = limit > 0 and period_id == current.id
        granted = 0
        if in_force:
            ledger.limit = limit
            free = limit - ledger.charged - held - sum(r.held for r in leases.values())
            granted = quota.grant(free, item.want, len(leases) + 1)
            held += granted
        else:
            held = 0  # not in force (or a period gone by): the router admits freely, nothing is held
        if held > 0:
            if mine is None:
                mine = QuotaLeaseRow(budget=budget, router=router_id, held=held, expires_at=now + quota.LEASE_TTL_S)
                s.add(mine)
            else:
                mine.held, mine.expires_at = held, now + quota.LEASE_TTL_S
            held_by[router_id] = mine
        elif mine is not None:
            s.delete(mine)
        ledger.updated_at = now
        others = sum(r.held for r in leases.values())
        if not concurrency and limit > 0 and ledger.limit > 0:  # a limit removed announces nothing
            newly, ledger.marks = quota.crossed(ledger.limit, charged_before, ledger.charged, ledger.marks)
            for pct in newly:
                crossing = Crossing(budget, scope, kind, pct, ledger.limit, ledger.charged, ledger.period_end)
                crossings.append(crossing)
                # In the transaction that set the mark: each threshold's event and audit row once a period,
                # whichever control plane answered.
                s.add(EventRow(time=now, kind="Warning" if pct >= 100 else "Normal", reason="BudgetThreshold",
                               object=crossing.object[:320], model="", node="", message=crossing.message()))
                s.add(AuditRow(at=now, actor="quota ledger", action="budget threshold", object=budget[:320],
                               outcome="ok", detail=crossing.message()[:2000]))
        if not in_force:
            return QuotaGrant(budget, 0, 0, 0 if limit == 0 else ledger.limit, ledger.charged,
                              max(0, ledger.limit - ledger.charged - others), ledger.period_end)
        return QuotaGrant(budget, granted, held, limit, ledger.charged, max(0, limit - ledger.charged - held - others),
                          ledger.period_end)

    def quota_ledger(self, budget: str) -> tuple[int, int, dict[str, int]] | None:
        """A budget's (limit, charged, {router: held}); None when it has no ledger row."""
        with self._session() as s:
            row = s.get(QuotaLedgerRow, budget)
            if row is None:
                return None
            held = {r.router: r.held for r in s.scalars(sa.select(QuotaLeaseRow).where(QuotaLeaseRow.budget == budget))}
            return row.limit, row.charged, held

    def quota_limits(self) -> tuple[dict[str, quota.Limits], dict[str, quota.Limits]]:
        """Every key's limits (its ``rpm``/``tpm`` as ``requests_per_minute``/``tokens_per_minute`` when its
        limits do not say them) and every project's, for ``control.usage``'s cache."""
        keys: dict[str, quota.Limits] = {}
        projects: dict[str, quota.Limits] = {}
        with self._session() as s:
            for key_id, rpm, tpm, limits in s.execute(sa.select(ApiKeyRow.id, ApiKeyRow.rpm, ApiKeyRow.tpm,
                                                                ApiKeyRow.limits)):
                doc = dict(limits or {})
                if rpm:
                    doc.setdefault("requests_per_minute", rpm)
                if tpm:
                    doc.setdefault("tokens_per_minute", tpm)
                keys[key_id] = _limits(doc)
            for name, limits in s.execute(sa.select(ProjectRow.name, ProjectRow.limits)):
                projects[name] = _limits(limits)
        return keys, projects

    def prune_quota(self, *, now: float) -> int:
        """Drops ledger rows whose period ended over ``LEDGER_KEPT_S`` ago, and their leases; how many rows."""
        with self._session.begin() as s:
            old = sa.select(QuotaLedgerRow.budget).where(QuotaLedgerRow.period_end < now - LEDGER_KEPT_S)
            gone = int(s.execute(sa.delete(QuotaLeaseRow).where(QuotaLeaseRow.budget.in_(old))).rowcount)
            gone += int(s.execute(sa.delete(QuotaLedgerRow)
                                  .where(QuotaLedgerRow.period_end < now - LEDGER_KEPT_S)).rowcount)
        return gone



def _limits(doc: object) -> quota.Limits:
    """A stored limits document; one the store holds but this version cannot read is no limit (logged)."""
    try:
        return quota.Limits.from_doc(doc)
    except quota.BadLimits as e:
        log.warning("stored limits ignored: %s", e)
        return quota.Limits()
