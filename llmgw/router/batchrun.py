"""The batch runner (issue 32): batches' lines run through this router on the capacity interactive requests leave.

The router claims a bounded chunk of lines from the control plane (``api.batches``: held for a lease), runs each
through its own path in the batch class (the admission queue's lowest), and posts the answers back; the control
plane writes each line's answer once and its leader writes the output files. A line starts only while, for its
model, the admission queue is empty (no interactive request waits), a quarter of its admission limit (where it
has one) is left free, the engines' reported waiting is below ``waiting_below`` and fewer than ``concurrency``
lines of this router run; otherwise it waits, backing off, and
lines not started are given back when their batch stops (cancelled, expired), when the router stops, or when a
line waited half its lease (so that no line runs past its lease, when another router may claim it). This throttle
is the runner's own: the admission queue's priority classes (``core.queueclasses``) order what does queue, the
runner keeps lines out of it.

A line's usage is metered as its key's, in its project, with the user ``batch:<user>`` (the batch marker in the
usage rollups), and charged to the key's and its project's budgets of a day or longer (``BUDGET_KINDS``): a team
cannot spend past its daily tokens or monthly spend by submitting a batch. A line those budgets refuse is answered
with their 429 (in the error file; the batch goes on). The per-minute rates and ``concurrent_requests`` are not
charged: they shape interactive traffic, and this runner's own throttle already keeps lines off the capacity
interactive requests use (a key with 60 requests a minute would otherwise fail most of a 2,000-line batch).

Answers the control plane did not take (a failover) are kept and posted again: a line is never
run twice by this router, and the control plane keeps its first answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from llmgw.api import batches as wire
from llmgw.core import priorities, quota
from llmgw.router import admission, asgi, errors, pick, proxying, request
from llmgw.router import metering as router_metering
from llmgw.router import quota as router_quota
from llmgw.router.auth import ANONYMOUS, KeyInfo
from llmgw.router.loadwatch import Loads
from llmgw.router.table import ModelRoute, TableHolder

log = logging.getLogger(__name__)
#: The usage rollups' user of a batch line: ``batch:`` and the batch creator's user.
BATCH_USER = "batch:"
#: The class a line is queued under (``core.priorities``): the lowest, admitted only while no other class waits.
CLASS = priorities.BATCH
#: The budgets a line is charged to: those of a day or longer (see the module's docstring).
BUDGET_KINDS = frozenset({"requests_per_day", "tokens_per_day", "tokens_per_month", quota.SPEND_KIND})
#: The fewest lines a claim asks for: a claim is a store transaction, not to be paid per line or two.
CHUNK = 16


class BatchTransport(Protocol):
    def claim(self, claim: wire.LineClaim) -> Awaitable[wire.ClaimedLines]: ...
    def results(self, doc: wire.LineResults) -> Awaitable[wire.ResultsAck]: ...


@dataclasses.dataclass(slots=True)
class _Held:
    lines: list[wire.Line] = dataclasses.field(default_factory=list)


class BatchRunner:
    def __init__(self, router_id: str, transport: BatchTransport, holder: TableHolder, *,
                 admission_: admission.Admission, loads: Loads, proxy: proxying.Proxy,
                 meter: router_metering.Meter | None, quota_: router_quota.QuotaClient | None = None,
                 concurrency: int = 4, waiting_below: float = 1.0,
                 idle_s: float = 1.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.router_id, self._transport, self._holder = router_id, transport, holder
        self._quota = quota_
        self._admission, self._loads, self._proxy, self._meter = admission_, loads, proxy, meter
        self.concurrency, self.waiting_below, self._idle_s, self._clock = concurrency, waiting_below, idle_s, clock
        self._waiting: dict[str, list[wire.Line]] = {}  # by model: claimed, not started
        self._fresh_until: dict[tuple[str, int], float] = {}  # a waiting line's start-by time: half its lease
        self._running: dict[str, int] = {}
        self._unslotted: dict[str, int] = {}  # lines started, not yet holding an admission slot
        self._done: list[wire.Result] = []
        self._released: list[tuple[str, int]] = []
        self._stopped: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None
        self._poster: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.ran = 0  # lines answered by this router (a test reads it)

    async def start(self) -> None:
        if self.concurrency > 0 and self._main is None:
            self._main = asyncio.create_task(self._run())
            self._poster = asyncio.create_task(self._post_loop())

    async def stop(self) -> None:
        for task in (self._main, *self._tasks):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._main, *self._tasks) if t is not None), return_exceptions=True)
        self._main = None
        self._released += [(x.batch, x.idx) for lines in self._waiting.values() for x in lines]
        self._waiting.clear()
        self._fresh_until.clear()
        if self._poster is not None:
            self._poster.cancel()
            await asyncio.gather(self._poster, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._post(), 5.0)

    # -- the throttle ----------------------------------------------------------------------------------------
    def open_for(self, route: ModelRoute) -> bool:
        """Whether a line of ``route`` may start now: nobody waits for it, its engines' queues are short."""
        if not route.endpoints or self._running.get(route.name, 0) >= self.concurrency:
            return False
        if self._admission.queued(route.name):
            return False
        limit = self._admission.limit(route.name)
        if limit is not None:
            # A quarter of the model's slots (at least one) kept for interactive requests: a line taking the last
            # one makes the next interactive request wait for a line's whole answer. An idle model runs one line.
            busy = self._admission.in_flight(route.name) + self._unslotted.get(route.name, 0)
            if busy and busy >= limit - max(1, -(-limit // 4)):
                return False
        engines = self._loads.engine
        waiting = max((e.waiting for ep in route.endpoints if (e := engines.get(ep.replica_id)) is not None),
                      default=0.0)
        return waiting < self.waiting_below

    # -- the loop --------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = self._idle_s / 4
        while True:
            table = self._holder.current
            started = 0
            wanted: list[str] = []
            for model, lines in list(self._waiting.items()):
                route = table.lookup(model)
                while lines and route is not None and self.open_for(route):
                    line = lines.pop(0)
                    start_by = self._fresh_until.pop((line.batch, line.idx), 0.0)
                    if line.batch in self._stopped or self._clock() > start_by:
                        # Stopped, or held so long (interactive load) that its lease may run out while it runs
                        # and another router run it too: given back unrun.
                        self._released.append((line.batch, line.idx))
                        continue
                    self._start(route, line)
                    started += 1
                if not lines:
                    del self._waiting[model]
            for route in table.models:
                if self.open_for(route) and not any(n in self._waiting for n in route.public_names()):
                    wanted.extend(route.public_names())
            chunk = max(self.concurrency * 2, CHUNK)
            if wanted and sum(map(len, self._waiting.values())) < chunk // 2:
                try:
                    claimed = await self._transport.claim(wire.LineClaim(self.router_id, tuple(wanted), chunk))
                except Exception as exc:  # the control plane away: tried again after a while
                    log.debug("batch claim failed: %s", exc)
                    claimed = wire.ClaimedLines((), 0)
                start_by = self._clock() + claimed.lease_s / 2
                for line in claimed.lines:
                    self._waiting.setdefault(line.model, []).append(line)
                    self._fresh_until[(line.batch, line.idx)] = start_by
                if claimed.lines:
                    backoff = self._idle_s / 4
                    continue
            if started:
                backoff = self._idle_s / 4
            else:
                backoff = min(backoff * 2, self._idle_s)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), backoff)

    def _start(self, route: ModelRoute, line: wire.Line) -> None:
        self._running[route.name] = self._running.get(route.name, 0) + 1
        self._unslotted[route.name] = self._unslotted.get(route.name, 0) + 1
        task = asyncio.create_task(self._line(route, line))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _line(self, route: ModelRoute, line: wire.Line) -> None:
        slotted = [False]
        try:
            status, body = await self._answer(route, line, slotted)
            self._done.append(wire.Result(line.batch, line.idx, status, body))
            self.ran += 1
        except errors.ApiError as exc:
            self._done.append(wire.Result(line.batch, line.idx, exc.status, exc.body().decode("utf-8", "replace")))
        except asyncio.CancelledError:
            self._released.append((line.batch, line.idx))
            raise
        except Exception as exc:  # never lost: answered as a failed line
            log.warning("batch %s line %d failed here: %s", line.batch, line.idx, exc)
            self._done.append(wire.Result(line.batch, line.idx, 500, "", json.dumps(
                {"code": "router_error", "message": f"the router could not run the line: {type(exc).__name__}"})))
        finally:
            self._running[route.name] -= 1
            if not slotted[0]:
                self._unslotted[route.name] -= 1
            self._wake.set()

    async def _answer(self, route: ModelRoute, line: wire.Line, slotted: list[bool]) -> tuple[int, str]:
        """The line sent through this router's path at batch priority: (status, the answer's text); ``slotted[0]``
        set once it holds its admission slot."""
        body = line.body.encode()
        req = request.parse(body)
        key = self._key(line)
        if key.project and not route.open_to(key.project):
            raise errors.model_not_found(line.model, [])
        # Its key's and project's long budgets (a 429 naming the budget when they are spent: the line's answer).
        ticket = (await self._quota.admit(key, self._holder.current.auth.projects, route, req, kinds=BUDGET_KINDS)
                  if self._quota is not None else None)
        metered = self._meter.start(dataclasses.replace(key, user=(BATCH_USER + key.user)[:63]), route) \
            if self._meter is not None else None
        status = 0
        chunks: list[bytes] = []

        async def send(message: asgi.Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        async def receive() -> asgi.Message:
            await asyncio.Event().wait()  # the client (this runner) never leaves
            return {"type": "http.disconnect"}

        # Queued in the batch class (the lowest: ``core.queueclasses``), by its key's priority and its project's share.
        queue_as = self._holder.current.auth.classes.lowered(key.queue_as, CLASS)
        try:
            async with self._admission.slot(route.name, priority=key.priority,
                                            queue_as=queue_as if not isinstance(queue_as, str) else key.queue_as):
                slotted[0] = True
                self._unslotted[route.name] -= 1
                await self._proxy.serve(route, req, line.url, time.perf_counter(), receive, send, pick.NO_KEY,
                                        metered=metered)
        finally:
            if metered is not None and self._meter is not None:
                self._meter.close(metered)
            if ticket is not None and self._quota is not None:
                self._quota.settle(ticket, *((metered.tokens, metered.spend_micros) if metered is not None else (0, 0)))
        return status, b"".join(chunks).decode("utf-8", "replace")

    def _key(self, line: wire.Line) -> KeyInfo:
        auth = self._holder.current.auth
        if not line.key:
            return dataclasses.replace(ANONYMOUS, project=line.project)
        for k in auth.by_hash.values():
            if k.id == line.key:
                return k
        raise errors.ApiError(401, f"The batch's API key {line.key} no longer exists or is disabled; its lines are "
                                   "not run.", type="invalid_request_error", code="invalid_api_key")

    # -- answers to the control plane -----------------------------------------------------------------------
    async def _post_loop(self) -> None:
        while True:
            await asyncio.sleep(0.25 if self._done or self._released else 1.0)
            try:
                await self._post()
            except Exception as exc:  # kept, posted again (a failover)
                log.debug("batch results not taken yet: %s", exc)

    async def _post(self) -> None:
        done, released = self._done[:wire.MAX_LINES], self._released[:wire.MAX_LINES]
        holding = tuple(sorted({x.batch for lines in self._waiting.values() for x in lines}))[:wire.MAX_LINES]
        if not done and not released and not holding:
            return
        ack = await self._transport.results(wire.LineResults(self.router_id, tuple(done), tuple(released), holding))
        del self._done[:len(done)]
        del self._released[:len(released)]
        if ack.stopped:
            self._stopped.update(ack.stopped)
            for model, lines in list(self._waiting.items()):
                keep = [x for x in lines if x.batch not in self._stopped]
                for x in lines:
                    if x.batch in self._stopped:
                        self._fresh_until.pop((x.batch, x.idx), None)
                self._released += [(x.batch, x.idx) for x in lines if x.batch in self._stopped]
                self._waiting[model] = keep

