"""One budget as a router holds it, what a request takes of it, and what a client is told of it (issue 26).

``quota.QuotaClient`` keeps a ``Budget`` per budget id and moves units between them and the control plane;
this module is its data and its pure parts: the lease and reservations of one budget (``Budget``), what an
admitted or waiting request took (``Ticket``, ``Pending``), a request's share of each budget of its plan
(``needs``: its prompt's estimate and ``max_tokens``, capped at the whole budget), and the answer's face:
OpenAI's ``x-ratelimit-*`` headers (``headers``, ``with_headers``) and the 429 naming the budget
(``refusal``, ``BudgetRefused``). Nothing here awaits or talks to the control plane.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.core import quota
from llmgw.router import ratelimit, request
from llmgw.router.table import ModelRoute

REQUESTS, TOKENS, SPEND, SLOTS = 0, 1, 2, 3
CLASS = {**dict.fromkeys(quota.REQUEST_KINDS, REQUESTS), **dict.fromkeys(quota.TOKEN_KINDS, TOKENS),
          quota.SPEND_KIND: SPEND, quota.CONCURRENCY_KIND: SLOTS}


class Budget:
    """One budget as this router sees it."""

    __slots__ = ("id", "scope", "kind", "cls", "limit", "reset_at", "lease", "reserved", "consumed", "returned",
                 "free", "charged", "granted", "known", "unlimited", "used_at", "taken", "win_at", "win_taken", "rate",
                 "waiting")

    def __init__(self, bid: str, scope: str, kind: str, limit: int, reset_at: float) -> None:
        self.id, self.scope, self.kind, self.cls = bid, scope, kind, CLASS[kind]
        self.limit, self.reset_at = limit, reset_at  # the table's, until the control plane answers
        self.lease = self.reserved = self.consumed = self.returned = 0
        self.free = self.charged = self.granted = 0
        self.known = self.unlimited = False
        self.used_at = 0.0
        self.taken = self.win_taken = self.waiting = 0  # taken: units admitted, ever (a rate's numerator)
        self.win_at = 0.0
        self.rate = 0.0  # units admitted per second over the last second or more

    def want(self, now: float, every_s: float) -> int:
        """What to ask for: the waiters' need and what ``2 * every_s`` of use at the recent rate takes."""
        if not self.win_at:
            self.win_at = now
        elif now - self.win_at >= 1.0:
            self.rate = (self.taken - self.win_taken) / (now - self.win_at)
            self.win_at, self.win_taken = now, self.taken
        # Within a window, at least what it took so far: a lease that ran out doubles at each sync.
        use = max(math.ceil(self.rate * 2 * every_s), self.taken - self.win_taken)
        return max(0, self.waiting + use - max(0, self.avail))

    @property
    def avail(self) -> int:
        return self.lease - self.reserved

    def remaining(self) -> int:
        """Free for everyone as last said, plus what this router holds unused."""
        if not self.known:
            return self.limit
        return max(0, self.free + self.avail)


class Ticket:
    """What one admitted request took; ``QuotaClient.settle`` gives it back as it was used."""

    __slots__ = ("takes", "plan")

    def __init__(self, takes: list[tuple[Budget, int]], plan: tuple[Budget, ...]) -> None:
        self.takes = takes
        self.plan = plan


class Pending:
    """A request whose share the leases held do not cover: ``QuotaClient.wait`` syncs for it."""

    __slots__ = ("takes", "plan")

    def __init__(self, takes: list[tuple[Budget, int]], plan: tuple[Budget, ...]) -> None:
        self.takes = takes
        self.plan = plan


class BudgetRefused(ratelimit.Throttled):
    """A 429 naming the budget; its headers carry ``Retry-After`` and the ``x-ratelimit-*`` ones."""

    def __init__(self, message: str, *, code: str, retry_after_s: int, extra: list[tuple[bytes, bytes]]) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.code = code
        self.type = "rate_limit_exceeded" if code == "rate_limit_exceeded" else "insufficient_quota"
        self._extra = extra

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [*super().headers(), *self._extra]


def headers(plan: tuple[Budget, ...], now: float) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-*`` for the tightest requests and tokens budget of ``plan``."""
    out: list[tuple[bytes, bytes]] = []
    for cls, name in ((REQUESTS, b"requests"), (TOKENS, b"tokens")):
        found = [b for b in plan if b.cls == cls and not b.unlimited]
        if not found:
            continue
        b = min(found, key=Budget.remaining)
        out += [(b"x-ratelimit-limit-" + name, b"%d" % b.limit),
                (b"x-ratelimit-remaining-" + name, b"%d" % b.remaining()),
                (b"x-ratelimit-reset-" + name, duration(b.reset_at - now).encode())]
    return out

def refusal(b: Budget, need: int, plan: tuple[Budget, ...], now: float, *, down: bool) -> BudgetRefused:
    """The 429 for a request ``b`` cannot cover (``down``: the control plane did not answer the last sync)."""
    scope, _, name = b.scope.partition(":")
    who = f"API key {name}'s" if scope == "key" else f"project {name}'s"
    wait = 1 if b.cls == SLOTS else max(1, math.ceil(b.reset_at - now))
    code = "rate_limit_exceeded" if b.kind.endswith("_per_minute") or b.cls == SLOTS else "budget_exceeded"
    unit = "" if b.cls != SPEND else " micros"
    if down and b.avail < need:
        message = (f"The budget service (the control plane) is unreachable and this router holds none of "
                   f"{who} {b.kind} (limit {b.limit}{unit}); retry in a few seconds.")
        return BudgetRefused(message, code="rate_limit_exceeded", retry_after_s=1,
                             extra=headers(plan, now))
    if b.cls == SLOTS:
        when = "when one of its requests ends"
    else:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b.reset_at))
        when = f"at {at} (in {duration(b.reset_at - now)})"
    message = f"This request exceeds {who} {b.kind}: limit {b.limit}{unit}, used {b.charged}{unit}"
    if b.cls in (TOKENS, SPEND):
        message += (f", and it reserves {need}{unit} (its prompt and max_tokens; a lower max_tokens "
                    "needs less)")
    message += f". It resets {when}."
    return BudgetRefused(message, code=code, retry_after_s=wait, extra=headers(plan, now))


def with_headers(send: Callable[[dict[str, Any]], Awaitable[None]],
                 headers: Callable[[], list[tuple[bytes, bytes]]]) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """``send``, adding ``headers()`` (the ``x-ratelimit-*``, as they stand then) to the answer's start.

    For the answers whose start is not made by ``relay.whole`` (streams, errors, cold holds); a whole answer
    carries them on its start (``metrics.Trace.ratelimit``) without a coroutine per message.
    """
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            extra = headers()
            if extra:
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


def with_minute(limits: quota.Limits, rpm: int, tpm: int) -> quota.Limits:
    """A key's limits with its ``rpm``/``tpm`` as requests/tokens per minute where its limits set none."""
    if (not rpm or limits.requests_per_minute) and (not tpm or limits.tokens_per_minute):
        return limits
    changes = {}
    if rpm and not limits.requests_per_minute:
        changes["requests_per_minute"] = rpm
    if tpm and not limits.tokens_per_minute:
        changes["tokens_per_minute"] = tpm
    return limits.merged(changes)


def needs(plan: tuple[Budget, ...], route: ModelRoute, req: request.CompletionRequest) -> list[tuple[Budget, int]]:
    """What the request takes of each budget of ``plan``."""
    takes: list[tuple[Budget, int]] = []
    tokens = spend = asked = -1
    for b in plan:
        cls = b.cls
        if cls == TOKENS or cls == SPEND:
            if tokens < 0:
                doc = req.doc
                limit = doc.get("max_tokens") or doc.get("max_completion_tokens") or 0
                # ``core.quota.reserve_tokens``, inline: once per request.
                asked = limit if isinstance(limit, int) and limit > 0 else 0
                tokens = max(1, len(req.body) // 4 + asked)
            # Never more than the whole budget because of the prompt's estimate: such a reservation could never
            # be covered, and a key with tokens_per_minute 5 was refused every request for good. Capped, the
            # request that crosses the line is let through (charged what it used), as core.quota's bound says.
            # A max_tokens above the whole budget is the client's own ask: refused, naming it.
            if cls == TOKENS:
                takes.append((b, b.limit if 0 < b.limit < tokens and asked <= b.limit else tokens))
                continue
            if spend < 0:
                prices = route.prices
                spend = round(tokens * prices.output_per_1m) if prices is not None else 0
            if spend:  # no price: the request costs nothing
                takes.append((b, b.limit if 0 < b.limit < spend else spend))
        else:
            takes.append((b, 1))
    return takes


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``1h30m0s``, ``20ms``."""
    if not math.isfinite(seconds):
        return "0s"
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
