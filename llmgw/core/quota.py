"""Budgets and quotas, and the arithmetic that makes them hold across every router (issue 26).

A project and a key may each carry ``Limits``: requests and tokens per minute, requests and tokens
per day, tokens and spend per month, and concurrent requests. Each limit in force is a *budget*: a
scope (``key:ID`` or ``project:NAME``), a kind and a period (the UTC minute, day or month; a
concurrency budget has none), named by ``budget_id``.

The control plane keeps, per budget, what was charged and what each router holds (a *lease*).
A router admits requests out of what it holds, and asks for more (``grant``) when it runs out;
the control plane grants only out of what is free (limit − charged − held by all routers), in
slices that shrink as the budget nears its limit. So:

- requests and concurrency never pass their limit (each request takes one unit before it is sent);
- tokens and spend are known only when the answer ends. A request takes its *reservation*
  (``reserve_tokens``: its prompt's length / 4 plus its ``max_tokens``; at most the whole limit when the
  prompt's estimate takes it past, so that request is the one that crosses the line, while a ``max_tokens``
  above the whole limit is refused) out of the lease before it
  is sent and is charged what the engine reports when it ends; a request whose reservation the
  lease cannot cover waits for a grant, and one the budget cannot cover is refused. A budget is
  therefore passed by at most what the requests in flight use beyond their reservations (with
  ``max_tokens`` set, only the prompt estimate's error).

A router that stops without giving back what it holds (``kill -9``) has its lease charged in full
when the lease expires: never an overshoot, at most one slice per dead router not served.

Pure: standard library only; the clock is passed in.
"""

from __future__ import annotations

import calendar
import dataclasses
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from llmgw.core.errors import LlmgwError

#: The kinds of limit, in the order they are shown.
KINDS: tuple[str, ...] = ("requests_per_minute", "tokens_per_minute", "requests_per_day", "tokens_per_day",
                          "tokens_per_month", "spend_per_month", "concurrent_requests")
REQUEST_KINDS = ("requests_per_minute", "requests_per_day")
TOKEN_KINDS = ("tokens_per_minute", "tokens_per_day", "tokens_per_month")
SPEND_KIND = "spend_per_month"
CONCURRENCY_KIND = "concurrent_requests"

#: The largest limit a budget may state: beyond it a limit is a typo, and the store's integers are 64-bit.
MAX_COUNT = 10**15
#: The largest spend a budget may state, in currency units.
MAX_SPEND = 10.0**9
#: Spend is counted in millionths of the currency unit (a price per 1M tokens is then micros per token).
MICROS = 1_000_000

#: A project member's roles, weakest first.
PROJECT_ROLES: tuple[str, ...] = ("viewer", "member", "owner")
DEFAULT_PROJECT = "default"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

#: Upper edges of the time-to-first-token buckets in ms (the last bucket is everything above).
TTFT_BUCKETS_MS: tuple[float, ...] = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)

#: The fractions of a budget at which the control plane tells (event, audit, metric, webhook).
THRESHOLDS: tuple[int, ...] = (80, 100)

#: Seconds a lease lives without its router syncing; past it, what it held is charged.
LEASE_TTL_S = 15.0


class BadLimits(LlmgwError, ValueError):
    """A limit that cannot be: the message names the field and what is allowed."""


def check_project_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadLimits(f"project name {name!r}: expected 1-63 lowercase letters, digits and '-', starting and "
                        "ending with a letter or digit")
    return name


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """A scope's limits; 0 (or 0.0) is "no limit"."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    requests_per_day: int = 0
    tokens_per_day: int = 0
    tokens_per_month: int = 0
    spend_per_month: float = 0.0  # currency units; see ``Prices``
    concurrent_requests: int = 0

    def __post_init__(self) -> None:
        for kind in KINDS:
            value = getattr(self, kind)
            if kind == SPEND_KIND:
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                        or not 0 <= value <= MAX_SPEND:
                    raise BadLimits(f"limits.{kind}: expected a number from 0 (no limit) to {MAX_SPEND:g}, "
                                    f"got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
                raise BadLimits(f"limits.{kind}: expected a whole number from 0 (no limit) to {MAX_COUNT}, "
                                f"got {value!r}")

    @property
    def any(self) -> bool:
        return any(getattr(self, k) for k in KINDS)

    def units(self, kind: str) -> int:
        """The limit in the units a budget counts: requests, tokens, spend micros, slots."""
        value = getattr(self, kind)
        return round(value * MICROS) if kind == SPEND_KIND else int(value)

    def in_force(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if getattr(self, k))

    def to_doc(self) -> dict[str, Any]:
        """Only the limits set, so ``{}`` is "none"."""
        return {k: getattr(self, k) for k in KINDS if getattr(self, k)}

    @classmethod
    def from_doc(cls, doc: Any) -> Limits:
        """Strict: an unknown field or a bad value is ``BadLimits`` naming it."""
        if doc is None:
            return cls()
        if isinstance(doc, Limits):
            return doc
        if not isinstance(doc, Mapping):
            raise BadLimits(f"limits: expected an object of {', '.join(KINDS)}, got {type(doc).__name__}")
        unknown = sorted(set(doc) - set(KINDS))
        if unknown:
            raise BadLimits(f"limits.{unknown[0]}: not a limit; the limits are {', '.join(KINDS)}")
        values = dict(doc)
        if SPEND_KIND in values and isinstance(values[SPEND_KIND], int) and not isinstance(values[SPEND_KIND], bool):
            values[SPEND_KIND] = float(values[SPEND_KIND])
        return cls(**values)

    def merged(self, changes: Mapping[str, Any]) -> Limits:
        """These limits with ``changes`` applied (each checked); ``None`` or 0 removes one."""
        doc = self.to_doc()
        for kind, value in changes.items():
            if value is None:
                doc.pop(kind, None)
            else:
                doc[kind] = value
        return Limits.from_doc(doc)


@dataclasses.dataclass(frozen=True, slots=True)
class Prices:
    """A model's prices per 1M tokens, in the cluster's currency unit; 0: free."""

    input_per_1m: float = 0.0
    cached_input_per_1m: float = 0.0
    output_per_1m: float = 0.0

    def __post_init__(self) -> None:
        for name in ("input_per_1m", "cached_input_per_1m", "output_per_1m"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not 0 <= value <= 10.0**6:
                raise BadLimits(f"pricing.{name}: expected a number from 0 to 1000000 (per 1M tokens), "
                                f"got {value!r}")

    @property
    def any(self) -> bool:
        return bool(self.input_per_1m or self.cached_input_per_1m or self.output_per_1m)

    def spend_micros(self, prompt: int, cached: int, completion: int) -> int:
        """What a request costs, in micros: cached prompt tokens at the cached price, the rest at input's."""
        cached = min(max(cached, 0), max(prompt, 0))
        fresh = max(prompt, 0) - cached
        # price per 1M tokens × MICROS / 1M = micros per token × price.
        return round(fresh * self.input_per_1m + cached * self.cached_input_per_1m
                     + max(completion, 0) * self.output_per_1m)

    def to_doc(self) -> dict[str, float]:
        return {"input_per_1m": self.input_per_1m, "cached_input_per_1m": self.cached_input_per_1m,
                "output_per_1m": self.output_per_1m}

    @classmethod
    def from_doc(cls, doc: Any) -> Prices:
        if doc is None:
            return cls()
        if not isinstance(doc, Mapping):
            raise BadLimits(f"pricing: expected an object, got {type(doc).__name__}")
        unknown = sorted(set(doc) - {"input_per_1m", "cached_input_per_1m", "output_per_1m"})
        if unknown:
            raise BadLimits(f"pricing.{unknown[0]}: unknown; expected input_per_1m, cached_input_per_1m, "
                            "output_per_1m")
        return cls(**{k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in doc.items()})


# -- periods and budgets ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Period:
    """A budget's current window: its id (in the budget's name), when it started and when it resets."""

    id: str
    start: float
    end: float  # inf for concurrency: never resets


def period(kind: str, now: float) -> Period:
    """The UTC minute, day or month ``now`` is in, for a kind of limit."""
    if kind == CONCURRENCY_KIND:
        return Period("now", 0.0, math.inf)
    t = time.gmtime(now)
    if kind.endswith("_per_minute"):
        start = float(int(now // 60) * 60)
        return Period(f"m{int(start // 60)}", start, start + 60.0)
    if kind.endswith("_per_day"):
        start = float(calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)))
        return Period(time.strftime("%Y-%m-%d", t), start, start + 86400.0)
    if kind.endswith("_per_month"):
        start = float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        return Period(time.strftime("%Y-%m", t), start, float(calendar.timegm((year, month, 1, 0, 0, 0))))
    raise BadLimits(f"unknown kind of limit {kind!r}; the kinds are {', '.join(KINDS)}")


def budget_id(scope: str, kind: str, period_id: str) -> str:
    """``key:key-ab12/tokens_per_day/2026-12-04``; ``scope`` is ``key:ID`` or ``project:NAME``."""
    return f"{scope}/{kind}/{period_id}"


def parse_budget(budget: str) -> tuple[str, str, str]:
    """The scope, kind and period of a budget id; BadLimits when it is not one."""
    scope, _, rest = budget.partition("/")
    kind, _, period_id = rest.partition("/")
    if kind not in KINDS or not scope.startswith(("key:", "project:")) or not period_id or len(budget) > 400:
        raise BadLimits(f"budget {budget[:100]!r}: expected SCOPE/KIND/PERIOD with SCOPE key:ID or project:NAME")
    return scope, kind, period_id


def grant(free: int, want: int, holders: int) -> int:
    """How much of a budget's ``free`` units to lease to a router asking for ``want``.

    At most ``want``, and at most an even share of half of what is free among ``holders`` (the
    routers holding a lease on it, the asker included), so slices shrink as the limit nears and no
    router takes what the others will need; at least 1 while anything is free.
    """
    if free <= 0 or want <= 0:
        return 0
    share = free // (2 * max(1, holders))
    return max(1, min(want, share)) if share else min(want, 1)


def reserve_tokens(body_bytes: int, max_tokens: int) -> int:
    """A request's token reservation: its body's bytes / 4 (a prompt token is ~4 bytes) plus ``max_tokens``."""
    return max(1, body_bytes // 4 + max(0, max_tokens))


def crossed(limit: int, before: int, after: int, marks: int) -> tuple[list[int], int]:
    """The thresholds (percent) newly passed going from ``before`` to ``after``, and the marks to store."""
    newly: list[int] = []
    if limit <= 0:
        return newly, marks
    for i, pct in enumerate(THRESHOLDS):
        bit = 1 << i
        if not marks & bit and after * 100 >= pct * limit:
            newly.append(pct)
            marks |= bit
    return newly, marks


# -- time to first token, as a histogram that sums -------------------------------------------------------
def ttft_bucket(ms: float) -> int:
    for i, edge in enumerate(TTFT_BUCKETS_MS):
        if ms <= edge:
            return i
    return len(TTFT_BUCKETS_MS)


def add_hist(a: list[int], b: list[int]) -> list[int]:
    n = len(TTFT_BUCKETS_MS) + 1
    a = (list(a) + [0] * n)[:n]
    for i, v in enumerate(b[:n]):
        a[i] += v
    return a


def hist_percentile(hist: list[int], pct: float) -> float:
    """The bucket edge (ms) under which ``pct`` percent of the requests' first tokens came; 0 with none."""
    total = sum(hist)
    if not total:
        return 0.0
    rank, seen = pct / 100 * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank and n:
            return TTFT_BUCKETS_MS[i] if i < len(TTFT_BUCKETS_MS) else TTFT_BUCKETS_MS[-1] * 2
    return TTFT_BUCKETS_MS[-1] * 2
