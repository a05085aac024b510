"""The router's ASGI app: the OpenAI API, each request forwarded straight to a ready engine.

``RouterApp`` answers ``GET /v1/models`` from the route table and forwards
``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and
``/v1/responses`` to one of the model's endpoints (``upstream`` picks and
retries). Everything the router says itself is an OpenAI-shaped error from
``errors``; what an engine says is relayed, its errors (and llama.cpp's answers) in OpenAI's
shape (``openai_shape``). With ``serve_metrics`` (the
standalone router) it also answers ``GET /metrics``; in the server process the
control plane's ``/metrics`` carries ``metrics.REGISTRY`` instead.

A stream is relayed chunk by chunk as each arrives, with nothing buffered. While
relaying, a second task watches ``receive()`` for the client's disconnect and
then cancels the relay, which closes the upstream connection: without it the
engine would keep generating for a client that left, holding a slot that queued
requests are waiting for. A stream whose engine is slow to answer gets SSE
keep-alive comments (``relay``; ``_open_keeping_alive`` says when the 200 may go
out before the engine's). Each request's timings go to ``metrics`` on a ``Trace``,
and with a ``signals`` reporter its arrival, first token and output tokens go to
the autoscaler's counts too (a few integer operations: ``signals``).

A model scaled to zero (autoscaled, no endpoint) stays listed, marked cold, and
its requests are held rather than refused (``_hold``): the reporter tells the
control plane at once, a stream gets its 200 and keep-alive comments, and each
new table wakes the held requests to look again; once the model has an endpoint
they are served as usual, past its cold-start timeout they get a 503 with
Retry-After. They wait before admission, not in it: a held request occupies no
slot, and admission's wait (and its 429) starts only once there is a replica.

The app owns its HTTP client pools: ``startup()`` and ``shutdown()``, or ASGI
lifespan when it runs alone. A ``watcher`` passed in is started and stopped with it.

Under ``server`` (the router's own HTTP server, standalone and in ``llmgw server``)
the scope carries the ``CANCELS`` extension: that server cancels the request's
task the moment the client's connection is lost, so the relay runs inline,
without the second task that watches ``receive()``: two tasks and an
``asyncio.wait`` per request were a fifth of the router's time at capacity.
Under any other ASGI server the watching task stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Protocol

from llmgw.router import (
    admission,
    asgi,
    auth,
    errors,
    metrics,
    openai_shape,
    pick,
    policies,
    prefix,
    ratelimit,
    relay,
    request,
    upstream,
)
from llmgw.router import events as router_events
from llmgw.router import signals as router_signals
from llmgw.router import tracing as router_tracing
from llmgw.router.client import Response
from llmgw.router.table import Endpoint, ModelRoute, RouteTable, TableHolder

log = logging.getLogger(__name__)

FORWARD_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"})
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"

Opened = tuple[Endpoint, Response]

#: The scope extension a server sets when it cancels the request's task on disconnect.
CANCELS = "llmgw.cancel_on_disconnect"
#: Retry-After of the 503 past a cold-start timeout: the replica that missed it is most often
#: seconds from Ready (its weights loading), and the retry is held again for a whole timeout.
COLD_RETRY_AFTER_S = 5


class Lifecycle(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class RouterApp:
    """A raw ASGI app serving the OpenAI API from the routes in ``holder``."""

    def __init__(self, holder: TableHolder, *, watcher: Lifecycle | None = None,
                 source: str = "the control plane", connect_timeout_s: float = 5.0,
                 max_endpoints: int = 3, max_body_bytes: int = 32 << 20, keepalive_s: float = 15.0,
                 serve_metrics: bool = False, admission_queue: int = 100, admission_wait_s: float = 30.0,
                 events: router_events.Sink | None = None, tracing: router_tracing.Tracing | None = None,
                 signals: router_signals.Reporter | None = None) -> None:
        self.holder = holder
        self._watcher = watcher
        self._source = source  # named in the 503 answered before the first table arrives
        self._max_body = max_body_bytes
        self._keepalive_s = keepalive_s  # 0 turns keep-alive comments off
        self._serve_metrics = serve_metrics
        # With the holder, the forwarder scrapes every endpoint's load, not only those already asked.
        self._forwarder = upstream.Forwarder(connect_timeout_s=connect_timeout_s,
                                             max_endpoints=max_endpoints, holder=holder, events=events)
        self._events = events  # ejections and recoveries, for the control plane
        self._tracing = tracing  # None: the untraced path, no SDK call anywhere
        self._models_cache: tuple[RouteTable, dict[frozenset[str], bytes]] | None = None
        self._limiter = ratelimit.RateLimiter()
        self._admission = admission.Admission(max_queue=admission_queue, max_wait_s=admission_wait_s)
        self._limits_seen: object = None
        # The autoscaler's signals (None: not reported); it reads per-replica in flight and the queue itself.
        self._signals = signals
        if signals is not None:
            signals.attach(holder, in_flight=self._forwarder.loads.in_flight, queued=self._admission.queued)
        # Requests held for a model at zero, each waiting on one of these for the next table.
        self._cold_waiters: list[asyncio.Future[None]] = []
        holder.listen(self._wake_held)
        # A new table's limits apply as it arrives: applied by the next request only, a replica that
        # turned Ready admitted nobody waiting until someone else came (and then a burst at once).
        holder.listen(self._apply_limits)

    def _apply_limits(self, table: RouteTable) -> None:
        if table.limits is not self._limits_seen:
            self._admission.set_limits(table.limits)
            self._limits_seen = table.limits

    async def startup(self) -> None:
        await self._forwarder.start()
        if self._events is not None:
            await self._events.start()
        if self._signals is not None:
            await self._signals.start()
        if self._watcher is not None:
            await self._watcher.start()

    async def shutdown(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
        await self._forwarder.close()
        if self._events is not None:
            await self._events.stop()
        if self._signals is not None:
            await self._signals.stop()
        if self._tracing is not None:
            await self._tracing.shutdown()

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        arrived = time.perf_counter()
        path, method = scope["path"], scope["method"]
        try:
            if path in FORWARD_PATHS:
                if method != "POST":
                    raise errors.method_not_allowed(method, path, "POST")
                if self._tracing is None:
                    await self._complete(scope, path, arrived, receive, send)
                else:
                    await self._tracing.around(self._complete, scope, path, arrived, receive, send)
            elif path == MODELS_PATH:
                if method not in ("GET", "HEAD"):
                    raise errors.method_not_allowed(method, path, "GET")
                key = self.holder.current.auth.identify(_authorization(scope))
                if isinstance(key, errors.ApiError):
                    raise key
                await asgi.send_bytes(send, 200, self._models_body(key))
            elif path == METRICS_PATH and self._serve_metrics and method in ("GET", "HEAD"):
                body, content_type = metrics.render()
                await asgi.send_bytes(send, 200, body, content_type=content_type.encode())
            else:
                raise errors.path_not_found(method, path)
        except errors.ApiError as exc:  # raised only before the response started
            if path in FORWARD_PATHS:
                # Refused before a model was found (bad body, unknown model): model="" so a
                # client's string never becomes a label.
                metrics.count_request("", "", exc.status)
            # A 429 says when to come back (Retry-After); other refusals carry no headers.
            extra = exc.headers() if isinstance(exc, ratelimit.Throttled | admission.Overloaded) else None
            await asgi.send_bytes(send, exc.status, exc.body(), extra=extra)
        except asgi.ClientGone:
            pass

    def _models_body(self, key: auth.KeyInfo) -> bytes:
        """Only the models ``key`` may use; cached per table and key scope."""
        table = self.holder.current
        if self._models_cache is None or self._models_cache[0] is not table:
            self._models_cache = (table, {})
        cache = self._models_cache[1]
        if key.models not in cache:
            # Each id once, owned by the model a lookup of it finds: a name two models claim
            # would otherwise be listed twice, once for a model that never gets its traffic.
            # A model at zero is listed, and routable: its first request is held while a replica starts.
            data = [{"id": name, "object": "model", "created": model.created, "owned_by": "llmgw"}
                    | ({"llmgw": {"state": "cold"}} if model.cold else {})
                    for model in table.auth.visible(key, table.models) for name in model.public_names()
                    if table.lookup(name) is model]
            cache[key.models] = json.dumps({"object": "list", "data": data}).encode()
        return cache[key.models]

    async def _complete(self, scope: asgi.Scope, path: str, arrived: float, receive: asgi.Receive,
                        send: asgi.Send) -> None:
        req = request.parse(await asgi.read_body(receive, limit=self._max_body))
        table = self.holder.current  # one snapshot for the whole request
        if not table.loaded:
            raise errors.table_not_loaded(self._source)
        header = _authorization(scope)
        key = table.auth.identify(header)
        if isinstance(key, errors.ApiError):
            raise key  # before the lookup, so a 404 lists no models to a stranger
        if key.id and self._events is not None:
            self._events.key_used(key.id)  # the keys page's "last used"; a dict update, reported every few seconds
        route = table.lookup(req.model)
        if route is None:
            raise errors.model_not_found(req.model, [n for m in table.auth.visible(key, table.models)
                                                     for n in m.public_names()])
        if not key.allows(route.name, route.served_name, *route.aliases):
            refused = table.auth.check(header, req.model, names=(route.name, route.served_name, *route.aliases))
            if isinstance(refused, errors.ApiError):
                raise refused
        throttled = self._limiter.admit(key)
        if throttled is not None:
            raise throttled
        if key.tpm:
            send = self._counting(send, key.id)
        counts = self._signals.arrived(route.name, arrived) if self._signals is not None else None
        started = held = False
        if not route.endpoints and route.autoscale is not None:
            # A model at zero: held here, not refused, until a replica is Ready (or its cold-start timeout).
            waited = await self._hold(route, req, key, arrived, send, counts)
            if waited is None:
                return  # answered already: the timeout's 503, or the model went away
            route, started = waited
            held = True
            table = self.holder.current
        self._apply_limits(table)
        # Hashing the prompt's blocks is for the routings that use them; round-robin skips it.
        affinity = (prefix.request_key(req.doc, session_header=_header(scope, b"x-llmgw-session"))
                    if route.routing in policies.KEYED else pick.NO_KEY)
        spans = router_tracing.CURRENT.get()
        if spans is not None:
            spans.admission_start()
        if (self._signals is not None and not self._admission.queued(route.name)
                and self._admission.would_wait(route.name)):
            self._signals.queue_forming()  # the autoscaler hears of a queue as it forms, not an interval later
        async with self._admission.slot(route.name, priority=key.priority):
            if spans is not None:
                spans.admitted(route.name)
            if self.holder.current is not table:
                # It waited in the queue while the table changed: the slot it got may be one a new
                # replica brought (the limit is per endpoint), which the route it read on arrival
                # lacks. Picking among the old endpoints then found them all full, and it got a 429
                # (seen in bench/autoscale.py, every request admitted as a scale-up's replicas came).
                fresh = self.holder.current.lookup(req.model)
                if fresh is not None and fresh.name == route.name:
                    route = fresh
            await self._serve(route, req, path, arrived, receive, send, affinity,
                              cancels=CANCELS in scope.get("extensions", ()), counts=counts, started=started,
                              held=held)

    def _counting(self, send: asgi.Send, key_id: str) -> asgi.Send:
        """``send``, also counting the tokens of the answer's usage for the key's tokens-per-minute.

        Only for keys with a tpm limit, so everyone else's chunks pass untouched.
        """
        usage = ratelimit.StreamUsage()
        whole: list[bytes] = []
        streaming = False

        async def counting(message: asgi.Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                streaming = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                for k, v in message.get("headers", ()))
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if streaming:
                    usage.feed(chunk)
                elif sum(map(len, whole)) < (1 << 20):
                    whole.append(chunk)
                if not message.get("more_body", False):
                    tokens = usage.close() if streaming else _usage_of(b"".join(whole))
                    self._limiter.record_tokens(key_id, tokens)
            await send(message)

        return counting

    async def _serve(self, route: ModelRoute, req: request.CompletionRequest, path: str, arrived: float,
                     receive: asgi.Receive, send: asgi.Send, affinity: pick.RequestKey, *,
                     cancels: bool = False, counts: router_signals.ModelCounts | None = None, started: bool = False,
                     held: bool = False) -> None:
        """Forward to one of the route's endpoints; ``started``: a held stream's 200 went out already."""
        trace = metrics.Trace(route.name, arrived)
        trace.signals = counts
        if held:
            trace.held = True
            if started:
                trace.status = 200
        if not route.endpoints:
            # Answered here, not raised: _http would count it again, under model="".
            refusal = errors.no_ready_endpoint(req.model, route.state, route.message)
            trace.status = refusal.status
            await asgi.send_error(send, refusal)
            trace.finish(time.perf_counter())
            return
        body = request.for_engine(req, route.served_name)
        # What the engine's answer needs to be OpenAI's shape (llama.cpp's); None for engines that conform.
        shape = openai_shape.plan(route.engine, path, req.doc)
        progress = False
        if request.wants_progress(req, route.engine):
            asked = request.with_progress(body)
            if asked is not None:
                body, progress = asked, True
        trace.series.in_flight.inc()
        if cancels:
            # The server cancels this task when the client goes, which cancels the relay
            # where it waits and closes the upstream connection: no watcher needed.
            try:
                await self._forward(route, path, body, send, trace, stream=req.stream, affinity=affinity,
                                    progress=progress, shape=shape, started=started)
            except asyncio.CancelledError:
                log.info("client left during a %s request for %r; upstream request cancelled", path, req.model)
                raise
            finally:
                trace.series.in_flight.dec()
                trace.finish(time.perf_counter())
            return
        forward = asyncio.ensure_future(self._forward(route, path, body, send, trace, stream=req.stream,
                                                      affinity=affinity, progress=progress, shape=shape,
                                                      started=started))
        watch = asyncio.ensure_future(asgi.wait_disconnect(receive))
        try:
            await asyncio.wait((forward, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Whichever finished first, the other must not outlive the request; this also
            # runs when the server cancels this handler at shutdown.
            watch.cancel()
            if not forward.done():
                forward.cancel()
                log.info("client left during a %s request for %r; upstream request cancelled",
                         path, req.model)
            await asyncio.gather(forward, watch, return_exceptions=True)
            trace.series.in_flight.dec()
            trace.finish(time.perf_counter())
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
                opened = await self._forwarder.open(route, path, body, key=affinity, stream=stream,
                                                    progress=progress)
            except errors.ApiError as exc:
                opened = exc
        if isinstance(opened, errors.ApiError):
            log.warning("%s", opened.message)
            if started:
                await relay.error_event(send, opened.body())
            else:
                trace.status = opened.status
                await asgi.send_error(send, opened)
            return
        endpoint, response = opened
        try:
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
                opened = await self._forwarder.open(route, path, body, key=affinity, stream=True,
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

    async def _hold(self, route: ModelRoute, req: request.CompletionRequest, key: auth.KeyInfo, arrived: float,
                    send: asgi.Send, counts: router_signals.ModelCounts | None) -> tuple[ModelRoute, bool] | None:
        """Hold a request for a model at zero until a table gives it an endpoint.

        Returns the model's route then, and whether a stream's 200 went out; None when the
        request was answered here: past the model's cold-start timeout a 503 with Retry-After
        and the model's state (a stream whose 200 went out gets it as its last event).

        The reporter is told at once (the wake: the control plane starts a replica now, not at
        its next pass), and the request counts as waiting for the autoscaler. A stream gets its
        200 and a keep-alive comment every ``keepalive_s``, as while it waits for a first token:
        a proxy in front would otherwise cut a connection idle through a cold start. No task:
        each wait is on a future the next table resolves (``_wake_held``), or its timeout.
        """
        assert route.autoscale is not None
        timeout_s = route.autoscale.cold_start_timeout_s
        deadline = arrived + timeout_s
        beats = req.stream and self._keepalive_s > 0
        next_beat = arrived + self._keepalive_s
        started = False
        loop = asyncio.get_running_loop()
        if counts is not None and self._signals is not None:
            self._signals.held(counts)
        if not self._cold_waiters:  # once per cold start, not once per request of a burst
            log.info("model %r has no replica (%s); holding its requests up to %gs for one to start", route.name,
                     route.state or "scaled to zero", timeout_s)
        refusal: errors.ApiError | None = None
        try:
            while (now := time.perf_counter()) < deadline:
                woken: asyncio.Future[None] = loop.create_future()
                self._cold_waiters.append(woken)
                try:
                    await asyncio.wait((woken,), timeout=(min(deadline, next_beat) if beats else deadline) - now)
                finally:
                    if not woken.done():
                        woken.cancel()
                        with contextlib.suppress(ValueError):
                            self._cold_waiters.remove(woken)
                current = self.holder.current.lookup(req.model)
                if current is None or current.name != route.name:
                    # Deleted while its request waited: what a request arriving now would be told.
                    table = self.holder.current
                    refusal = errors.model_not_found(req.model, [n for m in table.auth.visible(key, table.models)
                                                                 for n in m.public_names()])
                    break
                route = current
                if route.endpoints:
                    return route, started
                if route.autoscale is None:  # no longer autoscaled: nothing will start a replica for it
                    refusal = errors.no_ready_endpoint(req.model, route.state, route.message)
                    break
                timeout_s = route.autoscale.cold_start_timeout_s  # a new table may have changed it
                deadline = arrived + timeout_s
                if beats and time.perf_counter() >= next_beat:
                    if not started:
                        started = True  # before the send: a send cancelled mid-way has still written
                        await send(relay.stream_start(overhead_s=time.perf_counter() - arrived))
                    await relay.keepalive(send)
                    next_beat = time.perf_counter() + self._keepalive_s
            if refusal is None:
                refusal = errors.ColdStartTimeout(req.model, route.state, route.message, waited_s=timeout_s,
                                                  retry_after_s=COLD_RETRY_AFTER_S)
        finally:
            if counts is not None and self._signals is not None:
                self._signals.released(counts)
        log.warning("%s", refusal.message)
        metrics.count_request(route.name, "", refusal.status)
        if started:
            await relay.error_event(send, refusal.body())
        else:
            extra = refusal.headers() if isinstance(refusal, errors.ColdStartTimeout) else None
            await asgi.send_bytes(send, refusal.status, refusal.body(), extra=extra)
        return None

    def _wake_held(self, table: RouteTable) -> None:
        """A new table: every held request looks again (called inside ``TableHolder.swap``, maybe off the loop)."""
        if not self._cold_waiters:
            return
        waiters, self._cold_waiters = self._cold_waiters, []
        for woken in waiters:
            woken.get_loop().call_soon_threadsafe(_resolve, woken)

    async def _lifespan(self, receive: asgi.Receive, send: asgi.Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # reported to the server, which refuses to start
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # its wait may have timed out meanwhile
        woken.set_result(None)


def _authorization(scope: asgi.Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bytes(value)
    return None


def _header(scope: asgi.Scope, wanted: bytes) -> str:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return bytes(value).decode("latin-1")
    return ""


def _usage_of(body: bytes) -> int:
    try:
        return ratelimit.usage_tokens(json.loads(body))
    except ValueError:
        return 0
