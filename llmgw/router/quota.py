"""Budgets that hold across every router: this router's side of ``core.quota``'s leases (issue 26).

This module moves units between the control plane and this router's budgets; a budget's state, a
request's share of it and what the client is told (headers, the 429) are ``budgets``.

A request's budgets are its key's (``KeyInfo.limits``, with ``rpm``/``tpm`` as requests/tokens per
minute) and its project's (``Authenticator.projects``). A key and project with none cost nothing
here: ``admit`` returns None without an allocation or an await.

Otherwise each budget (``core.quota.budget_id``) has a local ``Budget``: the *lease* this router
holds (what the control plane granted, less what was consumed or given back since), what requests in
flight *reserve* of it, and what to report. Admission takes, out of the lease, 1 from each requests
budget, the token reservation (``core.quota.reserve_tokens``) from each tokens budget, that many
tokens at the output price from spend (nothing when the model has no price) and a slot from
concurrency. When a lease cannot cover its part, the request waits for one sync (``QuotaSync``
through the ``QuotaTransport``; one at a time, every waiter's need in it, plus what was used since
the last); when the answer still cannot cover it and the control plane granted nothing more, a
tokens or spend request whose lease would cover it once this router's requests in flight on that
budget settle waits for their settlements (``settle_wait_s`` at most); otherwise the request is
refused: a 429 in OpenAI's shape naming the budget, its limit, what is used and when it
resets, with ``Retry-After``. When the answer ends, ``settle`` charges what it used (the engine's
prompt + completion, its spend) and what it reserved beyond that goes back to the lease.

Every ``sync_every_s`` while anything is held, a background sync reports what was consumed, gives
back what sat unused for ``idle_return_s`` (concurrency slots not in use at once), and so renews
the leases (the control plane charges a lease not renewed for ``core.quota.LEASE_TTL_S``). With the
control plane unreachable, a budget whose lease is empty refuses, saying so (fail closed); the
others go on out of what is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from llmgw.api import usage as wire
from llmgw.core import quota
from llmgw.router import budgets, request
from llmgw.router.auth import KeyInfo
from llmgw.router.budgets import REQUESTS, SLOTS, SPEND, TOKENS, Budget, BudgetRefused, Pending, Ticket
from llmgw.router.budgets import duration as duration  # re-exported: callers and tests name quota.duration
from llmgw.router.budgets import with_headers as with_headers
from llmgw.router.table import ModelRoute

log = logging.getLogger(__name__)

QuotaTransport = Callable[[wire.QuotaSync], Awaitable[wire.QuotaAnswer]]

SYNC_EVERY_S = 1.0
IDLE_RETURN_S = 5.0
#: How old the x-ratelimit headers of an answer may be.
HEADERS_FOR_S = 0.1
#: Syncs one request may wait for while grants come in slices smaller than its need.
MAX_ROUNDS = 12
#: How long a request whose tokens (or spend) the budget cannot cover now waits for this router's requests
#: in flight on that budget to settle (each gives back what it reserved beyond what it used) before it is
#: refused.
SETTLE_WAIT_S = 5.0
class QuotaClient:
    """Admits requests out of this router's leases and keeps the leases in step with the control plane."""

    def __init__(self, router_id: str, transport: QuotaTransport, *, clock: Callable[[], float] = time.time,
                 sync_every_s: float = SYNC_EVERY_S, idle_return_s: float = IDLE_RETURN_S,
                 max_rounds: int = MAX_ROUNDS, settle_wait_s: float = SETTLE_WAIT_S) -> None:
        # The leases are this process's, not the router name's: a router restarted after kill -9 under the
        # same name was handed the lease its previous life held (units it had spent on requests in flight and
        # never reported) and spent them again: 106 served of a 100-a-day budget in tests/e2e/test_budgets.py.
        # Under a name of its own the dead life's lease expires and is charged in full (core.quota).
        self.router_id = f"{router_id[:240]}.{secrets.token_hex(4)}"
        self._transport = transport
        self._clock = clock
        self._every_s = sync_every_s
        self._idle_s = idle_return_s
        self._rounds = max_rounds
        self._settle_wait_s = settle_wait_s
        self._settled: asyncio.Future[None] | None = None  # resolved by the next ``settle``: waiters try again
        self._budgets: dict[str, Budget] = {}
        self._plans: dict[str, tuple[Any, float, tuple[Budget, ...]]] = {}
        self._inflight: asyncio.Future[None] | None = None
        self._started = 0  # syncs started, so a waiter knows whether one included its need
        self._shown: dict[int, tuple[tuple[Budget, ...], float, list[tuple[bytes, bytes]]]] = {}
        self.down = False  # the last sync failed: the control plane is unreachable
        self._loop: asyncio.Task[None] | None = None  # the background sync, running while anything is held
        #: Syncs answered, for tests.
        self.syncs = 0

    # -- which budgets ----------------------------------------------------------------------------------
    def plan(self, key: KeyInfo, projects: Mapping[str, quota.Limits]) -> tuple[Budget, ...]:
        """The budgets in force for ``key`` now (empty: none, nothing to do)."""
        if not key.id:
            return ()
        project = projects.get(key.project) if key.project else None
        now = self._clock()
        cached = self._plans.get(key.id)
        if cached is not None and now < cached[1] and cached[0][0] is key.limits and cached[0][3] is project \
                and cached[0][1] == key.rpm and cached[0][2] == key.tpm:
            return cached[2]  # the same limits objects (the same table): no tuple made, no comparison
        sig = (key.limits, key.rpm, key.tpm, project)
        if cached is not None and now < cached[1] and cached[0] == sig:
            self._plans[key.id] = (sig, cached[1], cached[2])
            return cached[2]
        made: list[Budget] = []
        until = math.inf
        scopes = [(f"key:{key.id}", budgets.with_minute(key.limits, key.rpm, key.tpm))]
        if project is not None:
            scopes.append((f"project:{key.project}", project))
        for scope, limits in scopes:
            for kind in limits.in_force():
                p = quota.period(kind, now)
                until = min(until, p.end)
                bid = quota.budget_id(scope, kind, p.id)
                budget = self._budgets.get(bid)
                if budget is None:
                    budget = self._budgets[bid] = Budget(bid, scope, kind, limits.units(kind), p.end)
                elif cached is not None and cached[0] != sig:
                    budget.unlimited = False  # the limits changed: ask the control plane again
                    budget.limit = limits.units(kind)
                made.append(budget)
        self._plans[key.id] = (sig, until, tuple(made))
        return tuple(made)

    # -- admission --------------------------------------------------------------------------------------
    def take(self, key: KeyInfo, projects: Mapping[str, quota.Limits], route: ModelRoute,
             req: request.CompletionRequest, *, kinds: Collection[str] | None = None) -> Ticket | Pending | None:
        """This request's share of each budget out of what is held, or what to ``wait`` for; None: no budget.
        ``kinds``: only the budgets of these kinds are charged (a batch line's: ``batchrun.BUDGET_KINDS``)."""
        plan = self.plan(key, projects)
        if kinds is not None:
            plan = tuple(b for b in plan if b.kind in kinds)
        if not plan:
            return None
        takes = budgets.needs(plan, route, req)
        return self._take(takes, plan) or Pending(takes, plan)

    async def admit(self, key: KeyInfo, projects: Mapping[str, quota.Limits], route: ModelRoute,
                    req: request.CompletionRequest, *, kinds: Collection[str] | None = None) -> Ticket | None:
        """``take``, waiting for a sync when what is held does not cover it; raises ``BudgetRefused``."""
        taken = self.take(key, projects, route, req, kinds=kinds)
        return await self.wait(taken) if isinstance(taken, Pending) else taken

    async def wait(self, pending: Pending) -> Ticket:
        """Sync until ``pending``'s share is held, or refuse it (``BudgetRefused``)."""
        takes, plan = pending.takes, pending.plan
        short = [(b, n) for b, n in takes if not b.unlimited and b.avail < n]
        for b, n in short:
            b.waiting += n
        try:
            mark = self._started
            for _ in range(self._rounds):
                included = await self._synced(mark)
                ticket = self._take(takes, plan)
                if ticket is not None:
                    return ticket
                if included and any(not b.unlimited and b.avail < n and (self.down or not b.granted)
                                    for b, n in takes):
                    break  # the budget granted nothing more
            # What this router's requests in flight reserved beyond their use comes back as they end (with 300
            # at once, a sixth of a tokens budget sat in reservations and the rest were refused): wait for
            # that (and for grants), bounded, before refusing.
            ticket = await self._settlements(takes, plan)
            if ticket is not None:
                return ticket
            b, n = next(((b, n) for b, n in takes if not b.unlimited and b.avail < n), short[0])
            raise self._refusal(b, n, plan)
        finally:
            for b, n in short:
                b.waiting -= n

    @staticmethod
    def _may_free(b: Budget, need: int) -> bool:
        """Requests in flight on ``b`` may give back enough for ``need``: a tokens or spend budget whose lease
        (with what the control plane last said was free) covers it once what is reserved comes back (requests
        and slots are used whole, or refused at once)."""
        return (b.cls == TOKENS or b.cls == SPEND) and b.reserved > 0 and b.lease + max(0, b.free) >= need

    async def _settlements(self, takes: list[tuple[Budget, int]], plan: tuple[Budget, ...]) -> Ticket | None:
        """Wait for requests in flight to settle (or a sync's grant) until ``takes`` is covered, or None: nothing
        in flight could free enough, or ``settle_wait_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_wait_s
        while True:
            ticket = self._take(takes, plan)
            if ticket is not None:
                return ticket
            short = next(((b, n) for b, n in takes if not b.unlimited and b.avail < n), None)
            left = deadline - loop.time()
            if short is None or left <= 0 or not self._may_free(*short):
                return None
            if self._settled is None or self._settled.done():
                self._settled = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._settled), left)
            except TimeoutError:
                return None

    def _take(self, takes: list[tuple[Budget, int]], plan: tuple[Budget, ...]) -> Ticket | None:
        for b, n in takes:
            if not b.unlimited and b.lease - b.reserved < n:
                return None
        now = self._clock()
        for b, n in takes:
            b.reserved += n
            b.taken += n
            b.used_at = now
        if self._loop is None or self._loop.done():
            self._loop = asyncio.ensure_future(self._run())
        return Ticket(takes, plan)

    def settle(self, ticket: Ticket, tokens: int, spend_micros: int) -> None:
        """The request ended having used ``tokens`` (prompt + completion) and ``spend_micros``."""
        for b, n in ticket.takes:
            b.reserved -= n
            used = n if b.cls == REQUESTS else tokens if b.cls == TOKENS else spend_micros if b.cls == SPEND else 0
            b.lease -= used
            b.consumed += used
        if self._settled is not None:
            self._wake()
        if self._loop is None or self._loop.done():
            self._loop = asyncio.ensure_future(self._run())

    def _wake(self) -> None:
        """Requests waiting for settlements try again."""
        settled, self._settled = self._settled, None
        if settled is not None and not settled.done():
            settled.set_result(None)

    # -- syncing ----------------------------------------------------------------------------------------
    async def _synced(self, mark: int) -> bool:
        """Wait for a sync; True when it started after ``mark`` (so it carried this waiter's need)."""
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._sync())
            self._started += 1
        number, sync = self._started, self._inflight
        with contextlib.suppress(Exception):
            await asyncio.shield(sync)
        return number > mark

    async def _sync(self) -> None:
        try:
            await self._exchange()
        finally:
            self._inflight = None

    async def _exchange(self, *, closing: bool = False) -> None:
        now = self._clock()
        items: list[wire.QuotaItem] = []
        sent: list[tuple[Budget, int, int]] = []
        for b in list(self._budgets.values()):
            if b.unlimited and not b.consumed:
                continue
            over = b.reset_at <= now
            idle = now - b.used_at >= (self._every_s if b.cls == SLOTS else self._idle_s)
            give = b.avail if b.avail > 0 and not b.waiting and (over or idle) else 0
            b.lease -= give
            b.returned += give
            want = 0 if over or closing else b.want(now, self._every_s)
            if not (b.consumed or b.returned or want or b.lease > 0):
                if over and not b.reserved:
                    del self._budgets[b.id]
                continue
            items.append(wire.QuotaItem(b.id, b.consumed, b.returned, want))
            sent.append((b, b.consumed, b.returned))
            b.consumed = b.returned = 0
        if not items:
            return
        try:
            answer = await self._transport(wire.QuotaSync(self.router_id, tuple(items)))
        except Exception as exc:
            for b, consumed, returned in sent:  # told again next time
                b.consumed += consumed
                b.returned += returned
            if not self.down:
                log.warning("the budget service (control plane) is unreachable: %s; admitting only out of what "
                            "this router holds", str(exc) or type(exc).__name__)
            self.down = True
            raise
        if self.down:
            log.info("the budget service answers again")
        self.down = False
        self.syncs += 1
        for g in answer.items:
            b = self._budgets.get(g.budget)
            if b is None:
                continue
            # What happened while the sync was in flight is still to be told: the lease is the answer's less it.
            b.lease = g.held - b.consumed - b.returned
            b.granted, b.free, b.charged, b.reset_at = g.granted, g.free, g.charged, g.reset_at
            b.known = True
            b.unlimited = g.limit == 0
            if g.limit:
                b.limit = g.limit
        self._wake()  # a grant: requests waiting for settlements try again

    async def _run(self) -> None:
        """While anything is held or to be told: a sync every ``sync_every_s``."""
        while True:
            await asyncio.sleep(self._every_s)
            if not any(b.lease > 0 or b.consumed or b.returned or b.reserved for b in self._budgets.values()):
                return  # nothing held: started again by the next admission
            with contextlib.suppress(Exception):
                await self._synced(self._started)

    async def stop(self) -> None:
        """Give back what is held (one try), then stop."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        for b in self._budgets.values():
            b.used_at = -math.inf
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._exchange(closing=True), 2.0)

    # -- what the client is told ------------------------------------------------------------------------
    def headers(self, plan: tuple[Budget, ...]) -> list[tuple[bytes, bytes]]:
        """OpenAI's ``x-ratelimit-*`` for ``plan``, as they stood at most ``HEADERS_FOR_S`` ago.

        Made once per key every so often rather than per answer (a few microseconds each): remaining is
        an estimate anyway, the control plane's last word plus what this router holds.
        """
        now = self._clock()
        shown = self._shown.get(id(plan))
        if shown is not None and shown[0] is plan and now - shown[1] < HEADERS_FOR_S:
            return shown[2]
        if len(self._shown) > 10_000:
            self._shown.clear()
        made = self.headers_now(plan, now)
        self._shown[id(plan)] = (plan, now, made)
        return made

    def headers_now(self, plan: tuple[Budget, ...], now: float) -> list[tuple[bytes, bytes]]:
        """OpenAI's ``x-ratelimit-*`` for the tightest requests and tokens budget of ``plan``."""
        return budgets.headers(plan, now)

    def _refusal(self, b: Budget, need: int, plan: tuple[Budget, ...]) -> BudgetRefused:
        return budgets.refusal(b, need, plan, self._clock(), down=self.down)
