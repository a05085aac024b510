"""Holding the requests of a model scaled to zero until a replica is Ready, instead of refusing them.

A model at zero (autoscaled, no endpoint) stays listed, marked cold, and its requests are held
(``ColdHold.hold``): the reporter tells the control plane at once, a stream gets its 200 and
keep-alive comments, and each new table wakes the held requests to look again (``wake``); once
the model has an endpoint they are served as usual, past its cold-start timeout they get a 503
with Retry-After. They wait before admission, not in it: a held request occupies no slot, and
admission's wait (and its 429) starts only once there is a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from llmgw.router import asgi, auth, errors, metrics, relay, request
from llmgw.router import signals as router_signals
from llmgw.router.table import ModelRoute, RouteTable, TableHolder

log = logging.getLogger(__name__)

#: Retry-After of the 503 past a cold-start timeout: the replica that missed it is most often
#: seconds from Ready (its weights loading), and the retry is held again for a whole timeout.
COLD_RETRY_AFTER_S = 5


class ColdHold:
    """The requests held for models at zero, each waiting on a future the next table resolves."""

    def __init__(self, holder: TableHolder, *, keepalive_s: float,
                 signals: router_signals.Reporter | None = None) -> None:
        self.holder = holder
        self._keepalive_s = keepalive_s  # 0 turns keep-alive comments off
        self._signals = signals
        #: One future per held request, resolved by the next table.
        self.waiters: list[asyncio.Future[None]] = []
        holder.listen(self.wake)

    async def hold(self, route: ModelRoute, req: request.CompletionRequest, key: auth.KeyInfo, arrived: float,
                   send: asgi.Send, counts: router_signals.ModelCounts | None) -> tuple[ModelRoute, bool] | None:
        """Hold a request for a model at zero until a table gives it an endpoint.

        Returns the model's route then, and whether a stream's 200 went out; None when the
        request was answered here: past the model's cold-start timeout a 503 with Retry-After
        and the model's state (a stream whose 200 went out gets it as its last event).

        The reporter is told at once (the wake: the control plane starts a replica now, not at
        its next pass), and the request counts as waiting for the autoscaler. A stream gets its
        200 and a keep-alive comment every ``keepalive_s``, as while it waits for a first token:
        a proxy in front would otherwise cut a connection idle through a cold start. No task:
        each wait is on a future the next table resolves (``wake``), or its timeout.
        """
        if counts is not None and self._signals is not None:
            self._signals.held(counts)
        if not self.waiters:  # once per cold start, not once per request of a burst
            assert route.autoscale is not None
            log.info("model %r has no replica (%s); holding its requests up to %gs for one to start", route.name,
                     route.state or "scaled to zero", route.autoscale.cold_start_timeout_s)
        try:
            route, started, refusal = await self._wait(route, req, key, arrived, send)
        finally:
            if counts is not None and self._signals is not None:
                self._signals.released(counts)
        if refusal is None:
            return route, started
        log.warning("%s", refusal.message)
        metrics.count_request(route.name, "", refusal.status)
        if started:
            await relay.error_event(send, refusal.body())
        else:
            extra = refusal.headers() if isinstance(refusal, errors.ColdStartTimeout) else None
            await asgi.send_bytes(send, refusal.status, refusal.body(), extra=extra)
        return None

    async def _wait(self, route: ModelRoute, req: request.CompletionRequest, key: auth.KeyInfo, arrived: float,
                    send: asgi.Send) -> tuple[ModelRoute, bool, errors.ApiError | None]:
        """Wait for the model's endpoint: its route, whether a stream's 200 went out, and the refusal if any."""
        assert route.autoscale is not None
        timeout_s = route.autoscale.cold_start_timeout_s
        deadline = arrived + timeout_s
        beats = req.stream and self._keepalive_s > 0
        next_beat = arrived + self._keepalive_s
        started = False
        loop = asyncio.get_running_loop()
        while (now := time.perf_counter()) < deadline:
            woken: asyncio.Future[None] = loop.create_future()
            self.waiters.append(woken)
            try:
                await asyncio.wait((woken,), timeout=(min(deadline, next_beat) if beats else deadline) - now)
            finally:
                if not woken.done():
                    woken.cancel()
                    with contextlib.suppress(ValueError):
                        self.waiters.remove(woken)
            current = self.holder.current.lookup(req.model)
            if current is None or current.name != route.name:
                # Deleted while its request waited: what a request arriving now would be told.
                table = self.holder.current
                return route, started, errors.model_not_found(
                    req.model, [n for m in table.auth.visible(key, table.models) for n in m.public_names()])
            route = current
            if route.endpoints:
                return route, started, None
            if route.autoscale is None:  # no longer autoscaled: nothing will start a replica for it
                return route, started, errors.no_ready_endpoint(req.model, route.state, route.message)
            timeout_s = route.autoscale.cold_start_timeout_s  # a new table may have changed it
            deadline = arrived + timeout_s
            if beats and time.perf_counter() >= next_beat:
                if not started:
                    started = True  # before the send: a send cancelled mid-way has still written
                    await send(relay.stream_start(overhead_s=time.perf_counter() - arrived))
                await relay.keepalive(send)
                next_beat = time.perf_counter() + self._keepalive_s
        return route, started, errors.ColdStartTimeout(req.model, route.state, route.message, waited_s=timeout_s,
                                                       retry_after_s=COLD_RETRY_AFTER_S)

    def wake(self, table: RouteTable) -> None:
        """A new table: every held request looks again (called inside ``TableHolder.swap``, maybe off the loop)."""
        if not self.waiters:
            return
        waiters, self.waiters = self.waiters, []
        for woken in waiters:
            woken.get_loop().call_soon_threadsafe(_resolve, woken)


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # its wait may have timed out meanwhile
        woken.set_result(None)
