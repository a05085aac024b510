"""Admission control: at most N requests per model at once, the rest wait in a bounded fair queue.

``async with admission.slot(model, priority=key.priority, queue_as=...):`` holds one of the
model's slots for the body. When all are taken the request waits, in the order ``core.fairqueue``
decides (issue 32): its priority class first (``core.queueclasses``), then the key's integer
priority, then a weighted fair share among the class's projects (first come first served with
``fair=False``), for at most ``max_wait_s``; a full queue or a wait that runs out raises
``Overloaded`` (429 with ``retry_after_s``). The waits and the depth per class go to ``/metrics``
(``queuemetrics``). Waiting here rather than at the engine keeps a burst
from piling into an engine's own queue, where a paying key's request would sit
behind a thousand batch ones.

A slot is handed straight from the request that leaves to the first waiter, so
a newcomer cannot overtake the queue. A waiter that gives up (timeout, client
gone) after it was handed a slot passes it on: without that, the slot would be
lost and the model would serve one fewer request at a time for good.

Limits: ``limits`` per model name, else ``default_limit``, else none (a model
without a limit is only counted). The table gives them: the optional
``models[].limits.concurrency`` of the endpoints document (``ModelEntry.concurrency``), capped
at ``limits.concurrency_per_replica`` times the model's endpoints
(``table.model_limits``), so a request waits here, not at a full replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Mapping

from llmgw.core import fairqueue
from llmgw.core.queueclasses import QueueAs
from llmgw.router import errors, metrics, queuemetrics

#: A request queued as nothing in particular: interactive, a flow of its own.
PLAIN = QueueAs()


@dataclasses.dataclass(slots=True)
class _Waiter:
    fut: asyncio.Future[None]
    queue_as: QueueAs


class Overloaded(errors.ApiError):
    """429: the model's queue is full or the wait ran out; ``retry_after_s`` for the header."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(429, message, type="rate_limit_exceeded", code="model_overloaded")
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())]


@dataclasses.dataclass(slots=True)
class _Gate:
    active: int = 0
    queued: int = 0  # waiters not yet granted nor gone
    queue: fairqueue.FairQueue[_Waiter] = dataclasses.field(default_factory=fairqueue.FairQueue)
    last_wait_s: float = 0.0
    hold_s: float = 1.0  # moving average of how long a slot is held, for Retry-After


class Admission:
    def __init__(self, *, limits: Mapping[str, int] | None = None, default_limit: int | None = None,
                 max_queue: int = 100, max_wait_s: float = 30.0, fair: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits: dict[str, int] = dict(limits or {})
        self.default_limit, self.max_queue, self.max_wait_s = default_limit, max_queue, max_wait_s
        #: Weighted fair shares among a class's projects; False: first come first served within a class.
        self.fair = fair
        self._clock = clock
        self._gates: dict[str, _Gate] = {}
        #: Requests refused with 429 since start, for metrics.
        self.rejected = 0

    def set_limits(self, limits: Mapping[str, int]) -> None:
        """New per-model limits (from a new table); a raised limit admits waiters at once."""
        self.limits = dict(limits)
        for model, gate in self._gates.items():
            self._grant(model, gate)

    def limit(self, model: str) -> int | None:
        return self.limits.get(model, self.default_limit)

    def in_flight(self, model: str) -> int:
        gate = self._gates.get(model)
        return gate.active if gate else 0

    def queued(self, model: str) -> int:
        gate = self._gates.get(model)
        return gate.queued if gate else 0

    def last_wait_s(self, model: str) -> float:
        """How long the last request admitted to ``model`` waited."""
        gate = self._gates.get(model)
        return gate.last_wait_s if gate else 0.0

    def would_wait(self, model: str) -> bool:
        """A request for ``model`` arriving now would wait for a slot (every slot taken, or others waiting)."""
        limit = self.limit(model)
        gate = self._gates.get(model)
        return limit is not None and gate is not None and (gate.active >= limit or gate.queued > 0)

    @property
    def queue_length(self) -> int:
        """Requests waiting, every model together."""
        return sum(g.queued for g in self._gates.values())

    def slot(self, model: str, *, priority: int = 0, queue_as: QueueAs = PLAIN) -> _Slot:
        """``async with`` it to hold one of ``model``'s slots (waiting in the queue when every one is taken)."""
        return _Slot(self, model, priority, queue_as)

    def _gate(self, model: str) -> _Gate:
        gate = self._gates.get(model)
        if gate is None:
            gate = self._gates[model] = _Gate(queue=fairqueue.FairQueue(fair=self.fair))
        return gate

    async def _acquire(self, model: str, gate: _Gate, priority: int, queue_as: QueueAs = PLAIN) -> None:
        limit = self.limit(model)
        if limit is None or (gate.active < limit and not gate.queued):
            gate.active += 1
            gate.last_wait_s = 0.0
            return
        if gate.queued >= self.max_queue:
            self.rejected += 1
            raise Overloaded(f"The model {model!r} is serving {gate.active} requests (its limit) and {gate.queued} "
                             f"more are waiting, the most that may; retry in {self._retry(gate)}s.",
                             retry_after_s=self._retry(gate))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gate.queue.push(_Waiter(fut, queue_as), rank=queue_as.rank, priority=priority, flow=queue_as.flow,
                        weight=queue_as.weight)
        gate.queued += 1
        metrics.QUEUED.inc()  # only waiters touch it: an admitted-at-once request never does
        queuemetrics.queued(queue_as.klass)
        start = self._clock()
        try:
            async with asyncio.timeout(self.max_wait_s):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                # Granted, but this request is leaving anyway: hand the slot on.
                gate.active -= 1
                self._grant(model, gate)
            else:
                fut.cancel()
                gate.queued -= 1
                metrics.QUEUED.dec()
                queuemetrics.left(queue_as.klass)
            if isinstance(exc, TimeoutError):
                self.rejected += 1
                raise Overloaded(f"The model {model!r} had no free slot within {self.max_wait_s:g}s "
                                 f"({gate.active} running, {gate.queued} waiting); retry in {self._retry(gate)}s.",
                                 retry_after_s=self._retry(gate)) from None
            raise
        gate.last_wait_s = self._clock() - start
        queuemetrics.waited(queue_as.klass, queue_as.project, gate.last_wait_s)

    def _grant(self, model: str, gate: _Gate) -> None:
        limit = self.limit(model)
        while gate.queue and (limit is None or gate.active < limit):
            waiter = gate.queue.pop()
            if waiter is None or waiter.fut.done():  # its waiter gave up; it counted itself out
                continue
            gate.queued -= 1
            metrics.QUEUED.dec()
            queuemetrics.left(waiter.queue_as.klass)
            gate.active += 1
            waiter.fut.set_result(None)

    def _retry(self, gate: _Gate) -> int:
        # The queue ahead drains at about (slots / hold time) a second; at least 1s.
        slots = max(1, gate.active)
        return max(1, math.ceil(gate.hold_s * (gate.queued + 1) / slots))



class _Slot:
    """One request's hold on a slot: a class, not ``contextlib.asynccontextmanager``, whose generator and
    wrapper cost ~3 us a request at capacity (issue 27); a request admitted at once does not await at all."""

    __slots__ = ("_admission", "_model", "_priority", "_queue_as", "_gate", "_start")

    def __init__(self, admission: Admission, model: str, priority: int, queue_as: QueueAs) -> None:
        self._admission = admission
        self._model = model
        self._priority = priority
        self._queue_as = queue_as

    async def __aenter__(self) -> None:
        admission, model = self._admission, self._model
        gate = admission._gates.get(model)
        if gate is None:
            gate = admission._gate(model)
        self._gate = gate
        limit = admission.limits.get(model, admission.default_limit)
        if limit is None or (gate.active < limit and not gate.queued):
            gate.active += 1
            gate.last_wait_s = 0.0
        else:
            await admission._acquire(model, gate, self._priority, self._queue_as)
        self._start = admission._clock()

    async def __aexit__(self, *exc: object) -> None:
        gate = self._gate
        gate.hold_s = 0.8 * gate.hold_s + 0.2 * (self._admission._clock() - self._start)
        gate.active -= 1
        if gate.queued:  # an int, not the queue's __len__: the exit of every request reads it
            self._admission._grant(self._model, gate)
