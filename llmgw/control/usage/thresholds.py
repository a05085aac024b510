"""A budget's 80 % and 100 %: counted and sent to the webhook (the ledger wrote the event and audit row).

The store writes each crossing's event and audit row in the sync that set its mark, so each is said
once a period whichever control plane answers. What is this process's own: the Prometheus counter
``llmgw_budget_threshold_total`` (by scope kind, limit kind and percent: a bounded label set, no key
or project names), and the optional webhook, which never holds a sync up (``webhook.Webhook``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import prometheus_client

from llmgw.control.store.quotas import Crossing
from llmgw.control.usage.webhook import Webhook


def document(c: Crossing, *, at: float) -> dict[str, Any]:
    """The webhook's body for one crossing."""
    scope_kind, _, name = c.scope.partition(":")
    return {"type": "budget.threshold", "at": at, "budget": c.budget, "scope": c.scope, scope_kind: name,
            "kind": c.kind, "percent": c.percent, "limit": c.limit, "used": c.charged,
            "reset_at": c.reset_at if math.isfinite(c.reset_at) else None, "message": c.message()}


class Thresholds:
    def __init__(self, registry: prometheus_client.CollectorRegistry, webhook: Webhook | None = None) -> None:
        self.webhook = webhook
        self.counter = prometheus_client.Counter(
            "llmgw_budget_threshold", "Budgets that reached a threshold of their limit (80 or 100 percent)",
            ["scope_kind", "kind", "percent"], registry=registry)

    def announce(self, crossings: Iterable[Crossing]) -> None:
        for c in crossings:
            self.counter.labels(scope_kind=c.scope.partition(":")[0], kind=c.kind, percent=str(c.percent)).inc()
            if self.webhook is not None:
                self.webhook.post(document(c, at=time.time()))
