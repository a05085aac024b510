"""An in-memory budget ledger and usage store (issue 26): the control plane's semantics without its store.

``Ledger.sync`` is a ``QuotaTransport`` and ``Ledger.ingest`` a ``UsageTransport``
(``router.quota``, ``router.usagejournal``) with the semantics ``core.quota`` states: per budget,
``charged + Σ held <= limit`` at every grant, grants by ``core.quota.grant`` out of what is free;
per journal, records above its mark applied once. Limits come from ``limits`` (budget scope and
kind → units), as the real control plane finds them in its store, never from the router.

Two users: tests and benches (``llmgw.sim.ledger.SimLedger`` is this class), and the router's hub over
a static table (``router.hub``), where it makes the key limits of the table exact across the hub's
workers. No lease expiry: a worker killed with a lease keeps it held until the period ends (fewer
requests served, never more). Budgets of periods that ended are dropped (``prune``) so a hub's memory
stays flat. Standard library only.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from llmgw.api import usage as wire
from llmgw.core import quota


@dataclasses.dataclass
class _Budget:
    limit: int
    charged: int = 0
    held: dict[str, int] = dataclasses.field(default_factory=dict)


class Ledger:
    """Budgets and usage for any number of routers sharing it; ``fail`` makes it unreachable."""

    def __init__(self, limits: dict[tuple[str, str], int] | None = None, *,
                 clock: Callable[[], float] = time.time, keep_records: bool = True) -> None:
        #: (scope, kind) -> limit in units, e.g. ("key:k1", "requests_per_day") -> 100.
        self.limits = dict(limits or {})
        self._clock = clock
        self.budgets: dict[str, _Budget] = {}
        self.marks: dict[str, int] = collections.defaultdict(int)
        #: The usage records stored, in the order applied.
        self.records: list[wire.UsageRecord] = []
        self.fail = False
        self.syncs = 0
        self._keep = keep_records  # False: only counted (a bench), so memory stays flat
        self.stored = 0
        self._pruned_at = self._clock()

    async def sync(self, s: wire.QuotaSync) -> wire.QuotaAnswer:
        if self.fail:
            raise ConnectionError("the sim ledger is down")
        self.syncs += 1
        self.prune()
        out = []
        for item in s.items:
            scope, kind, _ = quota.parse_budget(item.budget)
            limit = self.limits.get((scope, kind), 0)
            b = self.budgets.setdefault(item.budget, _Budget(limit))
            b.limit = limit
            held = b.held.get(s.router_id, 0)
            b.charged += item.consumed
            # Consumed beyond the lease is charged all the same (a request that used more than it reserved).
            held = max(0, held - item.consumed - item.returned)
            if kind == quota.CONCURRENCY_KIND:
                b.charged = 0  # slots are never consumed, only held and given back
            b.held[s.router_id] = held
            reset_at = quota.period(kind, self._clock()).end
            if not limit:
                out.append(wire.QuotaGrant(item.budget, 0, held, 0, b.charged, 0, reset_at))
                continue
            free = limit - b.charged - sum(b.held.values())
            holders = sum(1 for r, h in b.held.items() if h > 0 or r == s.router_id)
            granted = quota.grant(free, item.want, holders)
            b.held[s.router_id] = held + granted
            out.append(wire.QuotaGrant(item.budget, granted, held + granted, limit, b.charged,
                                       max(0, free - granted), reset_at))
        return wire.QuotaAnswer(tuple(out))

    async def ingest(self, batch: wire.UsageBatch) -> wire.UsageAck:
        if self.fail:
            raise ConnectionError("the sim ledger is down")
        mark = self.marks[batch.journal]
        for record in batch.records:
            if record.seq == mark + 1:
                if self._keep:
                    self.records.append(record)
                self.stored += 1
                mark = record.seq
        self.marks[batch.journal] = mark
        return wire.UsageAck(batch.journal, mark)

    def prune(self) -> None:
        """Drop the budgets of periods that ended (at most once a minute: a scan of every budget)."""
        now = self._clock()
        if now < self._pruned_at + 60.0:
            return
        self._pruned_at = now
        for bid in list(self.budgets):
            _, kind, period_id = quota.parse_budget(bid)
            if kind != quota.CONCURRENCY_KIND and period_id != quota.period(kind, now).id:
                del self.budgets[bid]

    def charged(self, scope: str, kind: str) -> int:
        """What one budget (its current period) has charged."""
        bid = quota.budget_id(scope, kind, quota.period(kind, self._clock()).id)
        b = self.budgets.get(bid)
        return b.charged if b is not None else 0

    def held(self, scope: str, kind: str) -> int:
        bid = quota.budget_id(scope, kind, quota.period(kind, self._clock()).id)
        b = self.budgets.get(bid)
        return sum(b.held.values()) if b is not None else 0
