"""One admitted request's trip: the engine's response opened, relayed to the client, the client watched.

``Proxy.serve`` sends the request to one of the route's endpoints (``upstream`` picks and retries)
and relays what the engine says (``relay``). A stream is relayed chunk by chunk as each arrives,
with nothing buffered. A stream whose engine is slow to answer gets SSE keep-alive comments
(``_open_keeping_alive`` says when the 200 may go out before the engine's).

The client leaving must stop the engine, or it would keep generating for nobody, holding a slot
queued requests are waiting for. Under ``server`` (the router's own HTTP server) the scope
carries the ``asgi.CANCELS`` extension: that server cancels the request's task the moment the
client's connection is lost, so the relay runs inline, without a second task watching
``receive()``: two tasks and an ``asyncio.wait`` per request were a fifth of the router's time
at capacity. Under any other ASGI server a second task watches ``receive()`` for the
disconnect and then cancels the relay, which closes the upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgw.router import asgi, errors, loraroute, metering, metrics, openai_shape, pick, relay, request, upstream
from llmgw.router import quota as router_quota
from llmgw.router import signals as router_signals
from llmgw.router.client import Response
from llmgw.router.table import Endpoint, ModelRoute

log = logging.getLogger(__name__)

Opened = tuple[Endpoint, Response]


class Proxy:
    """Forwards admitted requests through ``forwarder`` and relays the answers."""

    def __init__(self, forwarder: upstream.Forwarder, *, keepalive_s: float) -> None:
        self.forwarder = forwarder
        self._keepalive_s = keepalive_s  # 0 turns keep-alive comments off

    async def serve(self, route: ModelRoute, req: request.CompletionRequest, path: str, arrived: float,
                    receive: asgi.Receive, send: asgi.Send, affinity: pick.RequestKey, *,
                    cancels: bool = False, counts: router_signals.ModelCounts | None = None, started: bool = False,
                    held: bool = False, metered: metering.Metered | None = None,
                    ratelimit: Callable[[], list[tuple[bytes, bytes]]] | None = None) -> None:
        """Forward to one of the route's endpoints; ``started``: a held stream's 200 went out already.

        ``metered``: the request's metering; it learns the endpoint, the answer's usage and the outcome.
        ``ratelimit``: makes the answer's ``x-ratelimit-*`` headers, added to its start as it is sent.
        """
        trace = metrics.Trace(route.name, arrived)
        trace.signals = counts
        trace.meter = metered
        if ratelimit is not None:
            if req.stream or held or not route.endpoints:
                send = router_quota.with_headers(send, ratelimit)  # the starts made elsewhere: added as they pass
            else:
                trace.ratelimit = ratelimit  # a whole answer's start, or its error's, carries them (``_forward``)
        if held:
            trace.held = True
            if started:
                trace.status = 200
        if not route.endpoints:
            # Answered here, not raised: the app would count it again, under model="".
            refusal = errors.no_ready_endpoint(req.model, route.state, route.message)
            trace.status = refusal.status
            await asgi.send_error(send, refusal)
            _finish(trace, time.perf_counter())
            return
        body = request.for_engine(req, route.served_name)
        if route.lora is not None:  # a model with adapters the engine picks per request (llama.cpp)
            try:
                body = loraroute.apply(route.lora, req, body)
            except errors.ApiError as refusal:
                trace.status = refusal.status
                await asgi.send_error(send, refusal)
                _finish(trace, time.perf_counter())
                return
        if metered is not None:
            body = metered.ask_usage(req, path, body)  # a stream's usage, asked of the engine if the client did not
        # What the engine's answer needs to be OpenAI's shape (llama.cpp's); None for engines that conform.
        shape = openai_shape.plan(route.engine, path, req.doc)
        progress = False
        if request.wants_progress(req, route.engine):
            asked = request.with_progress(body)
            if asked is not None:
                body, progress = asked, True
        trace.series.in_flight.inc()
        if cancels:
            gone = False
            # The server cancels this task when the client goes, which cancels the relay
            # where it waits and closes the upstream connection: no watcher needed.
            try:
                await self._forward(route, path, body, send, trace, stream=req.stream, affinity=affinity,
                                    progress=progress, shape=shape, started=started)
            except asyncio.CancelledError:
                log.info("client left during a %s request for %r; upstream request cancelled", path, req.model)
                gone = True
                raise
            finally:
                trace.series.in_flight.dec()
                _finish(trace, time.perf_counter(), gone=gone)
            return
        forward = asyncio.ensure_future(self._forward(route, path, body, send, trace, stream=req.stream,
                                                      affinity=affinity, progress=progress, shape=shape,
                                                      started=started))
        # Any other server: a second task watches receive(), and a client that leaves cancels the relay.
        watch = asyncio.ensure_future(asgi.wait_disconnect(receive))
        try:
            await asyncio.wait((forward, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Whichever finished first, the other must not outlive the request; this also
            # runs when the server cancels this handler at shutdown.
            watch.cancel()
            gone = not forward.done()
            if gone:
                forward.cancel()
                log.info("client left during a %s request for %r; upstream request cancelled", path, req.model)
            await asyncio.gather(forward, watch, return_exceptions=True)
            trace.series.in_flight.dec()
            _finish(trace, time.perf_counter(), gone=gone)
        if not forward.cancelled():
            forward.result()  # re-raise what went wrong in the relay, if anything did

    async def _forward(self, route: ModelRoute, path: str, body: bytes, send: asgi.Send, trace: metrics.Trace,
                       *, stream: bool, affinity: pick.RequestKey, progress: bool = False,
                       shape: openai_shape.Plan | None = None, started: bool = False) -> None:
        trace.sent_upstream(time.perf_counter())
        opened: Opened | errors.ApiError
        if stream and self._keepalive_s > 0:
            started, opened = await self._open_keeping_alive(route, path, body, send, trace, affinity, progress,
                                                             started=started)
        else:
            try:
                opened = await self.forwarder.open(route, path, body, key=affinity, stream=stream,
                                                   progress=progress)
            except errors.ApiError as exc:
                opened = exc
        if isinstance(opened, errors.ApiError):
            log.warning("%s", opened.message)
            if started:
                await relay.error_event(send, opened.body())
            else:
                trace.status = opened.status
                extra = trace.ratelimit() if trace.ratelimit is not None else None
                await asgi.send_bytes(send, opened.status, opened.body(), extra=extra or None)
            return
        endpoint, response = opened
        if trace.meter is not None:
            trace.meter.served_by(endpoint)
        try:
            if trace.ratelimit is not None and (started or response.headers.get("Content-Type", "").startswith(
                    "text/event-stream")):
                send, trace.ratelimit = router_quota.with_headers(send, trace.ratelimit), None
            if response.headers.get("Content-Type", "").startswith("text/event-stream"):
                await relay.stream(endpoint, response, send, trace, keepalive_s=self._keepalive_s,
                                   started=started, shape=shape)
            elif started:
                await relay.as_event(endpoint, response, send, trace)
            else:
                await relay.whole(route, endpoint, response, send, trace, shape=shape)
        finally:
            # After a complete read the connection is already back in the pool and this
            # is a no-op; on cancel or error it drops the connection, which is what
            # tells the engine to stop generating.
            response.close()

    async def _open_keeping_alive(self, route: ModelRoute, path: str, body: bytes, send: asgi.Send,
                                  trace: metrics.Trace, affinity: pick.RequestKey, progress: bool = False,
                                  *, started: bool = False) -> tuple[bool, Opened | errors.ApiError]:
        """Open the upstream response; if that takes longer than ``keepalive_s``, start the stream.

        Returns whether the 200 went out, and the response or the refusal. The trade:
        sending the 200 early is what lets a keep-alive go out, and it gives up
        answering a later failure with a retry or a 502 (the status has gone; the
        failure becomes the stream's last event, which OpenAI's clients raise). So it
        happens only after ``keepalive_s`` of waiting: the retries worth having (a
        refused connect, a 503 from a loading engine) come back at once, so by then
        the engine has taken the request and a retry is unlikely to help, while
        without a byte a proxy in front would cut the connection at its idle timeout.
        """
        # No task per request for the common case, an engine that answers within
        # keepalive_s: a timer that, only when it fires, starts the task that sends the
        # 200 and the keep-alives while this one goes on waiting for the engine. ``started``: the
        # 200 went out already (a request held for a model at zero), only the keep-alives go on.
        sender: asyncio.Future[None] | None = None

        async def keep_alive() -> None:
            nonlocal started
            if not started:
                started = True  # before the send: a send cancelled mid-way has still written
                trace.status = 200
                await send(relay.stream_start(overhead_s=trace.before_upstream()))
            while True:
                await relay.keepalive(send)
                await asyncio.sleep(self._keepalive_s)

        def begin() -> None:
            nonlocal sender
            sender = asyncio.ensure_future(keep_alive())

        timer = asyncio.get_running_loop().call_later(self._keepalive_s, begin)
        opened: Opened | errors.ApiError | None = None
        try:
            try:
                opened = await self.forwarder.open(route, path, body, key=affinity, stream=True,
                                                   progress=progress)
            except errors.ApiError as exc:
                opened = exc
            finally:
                timer.cancel()
                if sender is not None:
                    sender.cancel()
                    await asyncio.gather(sender, return_exceptions=True)
        except BaseException:
            # The client left (this task is cancelled) while the engine had not answered
            # (open() is cancelled with it and drops the attempt), or just as it did:
            # close the response nobody will read, which drops the upstream connection.
            if isinstance(opened, tuple):
                opened[1].close()
            raise
        return started, opened


def _finish(trace: metrics.Trace, now: float, *, gone: bool = False) -> None:
    """The request's metrics, and its outcome to its metering (``gone``: the client left, metered as 499)."""
    trace.finish(now)
    if trace.meter is not None:
        trace.meter.ended(499 if gone else trace.status, trace.replica, trace.ttft, now - trace.arrived)
