"""The router's ASGI app: the OpenAI API, each request forwarded straight to a ready engine.

``RouterApp`` is the front: it owns the parts and sends each request to the one whose job it is.

* ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/responses``:
  ``completions`` (the key, the model, rate limits, a model at zero held by ``cold``, admission),
  then ``proxying`` (the engine's response opened by ``upstream``, relayed by ``relay``, the client's
  disconnect watched);
* ``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API, translated onto the
  chat completions' path and back (``anthropic``), its refusals in Anthropic's shape;
* ``GET /v1/models``: from the route table, only the models the key may use (Anthropic's list for a request
  that says ``anthropic-version``: ``anthropic.models``), cached per table, each
  with ``llmgw.embeddings`` where its spec says whether it embeds (``completions`` refuses
  ``/v1/embeddings`` for one that does not, saying how to turn them on);
* ``GET /metrics`` with ``serve_metrics`` (the standalone router); in the server process the
  control plane's ``/metrics`` carries ``metrics.REGISTRY`` instead.

Everything the router says itself is an OpenAI-shaped error from ``errors``; what an engine says is
relayed, its errors (and llama.cpp's answers) in OpenAI's shape (``openai_shape``). Each request's
timings go to ``metrics`` on a ``Trace``, and with a ``signals`` reporter its arrival, first token and
output tokens go to the autoscaler's counts too (a few integer operations: ``signals``).

The app owns its HTTP client pools: ``startup()`` and ``shutdown()``, or ASGI lifespan when it runs
alone. A ``watcher`` passed in is started and stopped with it.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from llmgw.api.batches import openai_path
from llmgw.router import (
    admission,
    asgi,
    auth,
    batchrun,
    client,
    cold,
    completions,
    errors,
    kvview,
    metering,
    metrics,
    proxying,
    ratelimit,
    tokenizers,
    upstream,
    usagejournal,
)
from llmgw.router import quota as router_quota
from llmgw.router import reports as router_events
from llmgw.router import signals as router_signals
from llmgw.router import tracing as router_tracing
from llmgw.router.anthropic import messages as anthropic_messages
from llmgw.router.anthropic import models as anthropic_models
from llmgw.router.asgi import authorization
from llmgw.router.table import ModelRoute, RouteTable, TableHolder

FORWARD_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"})
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"


class Lifecycle(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class RouterApp:
    """A raw ASGI app serving the OpenAI API from the routes in ``holder``."""

    def __init__(self, holder: TableHolder, *, watcher: Lifecycle | None = None,
                 source: str = "the control plane", connect_timeout_s: float = 5.0,
                 max_endpoints: int = 3, max_body_bytes: int = 32 << 20, keepalive_s: float = 15.0,
                 serve_metrics: bool = False, admission_queue: int = 100, admission_wait_s: float = 30.0,
                 fair: bool = True,
                 events: router_events.Sink | None = None, tracing: router_tracing.Tracing | None = None,
                 signals: router_signals.Reporter | None = None,
                 quota: router_quota.QuotaTransport | None = None, usage: usagejournal.UsageTransport | None = None,
                 usage_journal_dir: Path | None = None, router_id: str = "router",
                 metrics_source: Callable[[], Awaitable[tuple[bytes, str]]] | None = None,
                 tokenizer_fetch: tokenizers.Fetch | None = None, kv_view: kvview.KvView | None = None,
                 batches: batchrun.BatchTransport | None = None, batch_concurrency: int = 4,
                 batch_waiting_below: float = 1.0,
                 files: Callable[[asgi.Scope, asgi.Receive, asgi.Send], Awaitable[None]] | None = None) -> None:
        """``quota``/``usage``: the control plane's budget and usage services (None: the per-router rpm/tpm
        window, and nothing metered); ``usage_journal_dir``: where unsent usage survives a ``kill -9``;
        ``metrics_source``: what ``GET /metrics`` answers (a hub's worker: every worker's sum), else ``render()``;
        ``tokenizer_fetch``: how ``kv_aware`` models' tokenizer files are fetched (``tokenizers``; None: never);
        ``batches``: the control plane's batch lines (issue 32), run here on idle capacity (``batchrun``);
        ``files``: what answers ``/v1/files`` and ``/v1/batches`` (a standalone router's ``controlpass``)."""
        self.holder = holder
        self._watcher = watcher
        self._serve_metrics = serve_metrics
        self._metrics_source = metrics_source
        # With the holder, the forwarder scrapes every endpoint's load, not only those already asked.
        self._forwarder = upstream.Forwarder(connect_timeout_s=connect_timeout_s,
                                             max_endpoints=max_endpoints, holder=holder, events=events,
                                             kv_view=kv_view)
        self._events = events  # ejections and recoveries, for the control plane
        self._tracing = tracing  # None: the untraced path, no SDK call anywhere
        self._models_cache: tuple[RouteTable, dict[tuple[frozenset[str], str], bytes]] | None = None
        self._admission = admission.Admission(max_queue=admission_queue, max_wait_s=admission_wait_s,
                                              fair=fair)
        # The autoscaler's signals (None: not reported); it reads per-replica in flight and the queue itself.
        self._signals = signals
        if signals is not None:
            signals.attach(holder, in_flight=self._forwarder.loads.in_flight, queued=self._admission.queued)
        self._proxy = proxying.Proxy(self._forwarder, keepalive_s=keepalive_s)
        # Requests held for a model at zero, each woken by the next table.
        self._cold = cold.ColdHold(holder, keepalive_s=keepalive_s, signals=signals)
        self._metering(router_id, quota, usage, usage_journal_dir)
        self.tokenizers = tokenizers.Tokenizers(tokenizer_fetch)
        self._completions = completions.Completions(
            holder, proxy=self._proxy, cold_hold=self._cold, admission=self._admission,
            limiter=ratelimit.RateLimiter(), source=source, max_body_bytes=max_body_bytes, events=events,
            signals=signals, meter=self.meter, quota=self.quota, tokenizers=self.tokenizers)
        self._complete = self._completions.complete
        # Anthropic's Messages API: onto the same path (``anthropic``; traced as it is), after the OpenAI paths.
        self._messages = anthropic_messages.Messages(
            holder, self._complete if tracing is None else functools.partial(tracing.around, self._complete),
            max_body_bytes=max_body_bytes)
        self._files = files
        self.batches = (batchrun.BatchRunner(router_id, batches, holder, admission_=self._admission,
                                             loads=self._forwarder.loads, proxy=self._proxy, meter=self.meter,
                                             quota_=self.quota, concurrency=batch_concurrency,
                                             waiting_below=batch_waiting_below)
                        if batches is not None else None)
        #: ``http`` scopes straight to their handler, for a server that knows (``server.Server``): no ``__call__``.
        self.asgi_http = self._http

    def _metering(self, router_id: str, quota: router_quota.QuotaTransport | None,
                  usage: usagejournal.UsageTransport | None, journal_dir: Path | None) -> None:
        """The meter (with a usage or a quota service) and the budgets (with a quota service)."""
        self.journal = usagejournal.UsageJournal(router_id, usage, journal_dir) if usage is not None else None
        self.quota = router_quota.QuotaClient(router_id, quota) if quota is not None else None
        self.meter = (metering.Meter(self.journal.append if self.journal is not None else None)
                      if usage is not None or quota is not None else None)

    def use_tunnels(self, tunnels: client.Tunnels | None) -> None:
        """Engines of nodes behind NAT are reached through ``tunnels`` (``router.tunnel.hub``; issue 33)."""
        self._forwarder.use_tunnels(tunnels)

    async def startup(self) -> None:
        await self._forwarder.start()
        if self._events is not None:
            await self._events.start()
        if self._signals is not None:
            await self._signals.start()
        if self.journal is not None:
            await self.journal.start()
        if self._watcher is not None:
            await self._watcher.start()
        if self.batches is not None:
            await self.batches.start()

    async def shutdown(self) -> None:
        if self.batches is not None:
            await self.batches.stop()
        # What is held goes back and what is metered goes out while the control plane is still followed.
        if self.quota is not None:
            await self.quota.stop()
        if self.journal is not None:
            await self.journal.stop()
        if self._watcher is not None:
            await self._watcher.stop()
        await self._forwarder.close()
        await self.tokenizers.close()
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
                if anthropic_models.asked(scope):  # an Anthropic SDK's list: its shape, x-api-key read too
                    await anthropic_models.serve(self.holder, scope, send, self._models_body,
                                                 authorization(anthropic_messages.with_key(scope)))
                    return
                auth_now = self.holder.current.auth
                key = auth_now.identify(authorization(scope))
                if isinstance(key, errors.ApiError):
                    raise key
                # A key with requests or tokens budgets learns where they stand here too.
                extra = self.quota.headers(self.quota.plan(key, auth_now.projects)) if self.quota is not None else None
                await asgi.send_bytes(send, 200, self._models_body(key), extra=extra or None)
            elif path in anthropic_messages.PATHS:
                await self._messages.serve(scope, path, arrived, receive, send)
            elif self._files is not None and openai_path(path):
                await self._files(scope, receive, send)
            elif path == METRICS_PATH and self._serve_metrics and method in ("GET", "HEAD"):
                body, content_type = (await self._metrics_source() if self._metrics_source is not None
                                      else metrics.render())
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
        scope = (key.models, key.project)
        if scope not in cache:
            # Each id once, owned by the model a lookup of it finds: a name two models claim
            # would otherwise be listed twice, once for a model that never gets its traffic.
            # A model at zero is listed, and routable: its first request is held while a replica starts.
            data = [{"id": name, "object": "model", "created": model.created, "owned_by": "llmgw"} | _parent(model)
                    | _ours(model)
                    for model in table.auth.visible(key, table.models) for name in model.public_names()
                    if table.lookup(name) is model]
            cache[scope] = json.dumps({"object": "list", "data": data}).encode()
        return cache[scope]

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


def _parent(model: ModelRoute) -> dict[str, Any]:
    """A LoRA adapter's base, as vLLM lists one (``parent``; ``root`` is vLLM's path to the adapter, not ours)."""
    return {"parent": model.parent} if model.parent else {}


def _ours(model: ModelRoute) -> dict[str, Any]:
    """What ``/v1/models`` adds to OpenAI's fields under ``llmgw``: held at zero, and whether it embeds if known."""
    ours: dict[str, Any] = {}
    if model.cold:
        ours["state"] = "cold"
    if model.embeddings is not None:
        ours["embeddings"] = model.embeddings
    return {"llmgw": ours} if ours else {}
