"""Outlier ejection: an endpoint that keeps failing is taken out of rotation for a while.

The control plane marks a replica Ready from its health checks every few seconds;
between two checks an engine can crash, wedge or start answering 503, and every
request routed to it pays a failed attempt (a connect timeout is seconds). So the
router keeps its own record of what each endpoint did to real requests:

* a failure is a refused or timed-out connect, no response header in time, or an
  HTTP 500/502/503/504. A 4xx never counts: it is the request's fault, and a
  client sending bad requests must not eject a healthy engine;
* ``threshold`` failures in a row (default 3) eject the endpoint for ``base_s``
  (2 s). When that passes it is on probation: it takes requests again, and one
  more failure ejects it for twice as long, up to ``max_s`` (60 s);
* a success resets everything;
* an engine that fails TLS verification (``enginetls``: not the cluster CA's engine certificate
  for its node) is ejected at the first failure (``at_once``): retrying it cannot help.

``Outliers`` only decides; ``upstream`` skips the ejected endpoints (all of them
ejected: tried anyway, rather than failing the request), logs each ejection once
and counts it; ``events`` reports each ejection, and the success that ends it, to the
control plane, which shows them on the replica.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection

FAILURE_STATUSES = frozenset({500, 502, 503, 504})


@dataclasses.dataclass(frozen=True, slots=True)
class Ejection:
    """The decision to take ``replica_id`` out of rotation for ``for_s`` seconds, and why."""

    replica_id: str
    for_s: float
    reason: str
    failures: int = 1  # in a row that caused it: the threshold, or 1 on probation


@dataclasses.dataclass(slots=True)
class _Record:
    failures: int = 0  # in a row, since the last success or ejection
    until: float = 0.0  # ejected while the clock is below this
    backoff_s: float = 0.0  # the last ejection's length; 0 until the first, and again after a success


class Outliers:
    """Per-replica failure streaks and ejections, on an injected clock."""

    def __init__(self, *, threshold: int = 3, base_s: float = 2.0, max_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._threshold = threshold
        self._base_s = base_s
        self._max_s = max_s
        self._clock = clock
        self._records: dict[str, _Record] = {}  # only replicas whose last attempt failed

    def is_ejected(self, replica_id: str) -> bool:
        record = self._records.get(replica_id)
        return record is not None and self._clock() < record.until

    def ejected(self, replica_ids: Collection[str]) -> set[str]:
        """Which of ``replica_ids`` are out of rotation now."""
        if not self._records:  # the common case: nothing failing, nothing to look up
            return set()
        return {r for r in replica_ids if self.is_ejected(r)}

    def failed(self, replica_id: str, reason: str, *, at_once: bool = False) -> Ejection | None:
        """Record a failure; return the ejection it causes, if it causes one (``at_once``: this one does)."""
        now = self._clock()
        record = self._records.setdefault(replica_id, _Record())
        if now < record.until:
            return None  # tried while ejected (every endpoint was): already out
        if record.backoff_s > 0:
            # On probation after an ejection: one failure is enough to go out again, longer.
            record.backoff_s = min(record.backoff_s * 2, self._max_s)
            failures = 1
        else:
            record.failures += 1
            if record.failures < self._threshold and not at_once:
                return None
            record.backoff_s = self._base_s
            failures = record.failures
        record.failures = 0
        record.until = now + record.backoff_s
        return Ejection(replica_id, record.backoff_s, reason, failures)

    def succeeded(self, replica_id: str) -> bool:
        """Record a success; True when it ends a streak or a probation (worth a log line)."""
        if not self._records:
            return False
        return self._records.pop(replica_id, None) is not None

    def forget(self, keep: Collection[str]) -> None:
        """Drop the records of replicas not in ``keep`` (gone from the table)."""
        for replica_id in [r for r in self._records if r not in keep]:
            del self._records[replica_id]
