"""The path of a forwarded request, from its body to an admitted slot: who asks, for what, and whether now.

``Completions.complete`` reads the body (``request``), takes one snapshot of the route table,
identifies the key (``auth``; before the model lookup, so a 404 lists no models to a stranger),
finds the model, applies the key's rate limits (``ratelimit``; a key with a tokens-per-minute
limit has its answer's usage counted on the way out), holds a request for a model at zero
(``cold``), computes the affinity key for the policies that read it (``policies.KEYED``), waits
for a slot (``admission``) and hands the request to ``proxying``. Everything refused here is
raised as an ``errors.ApiError``, which the app answers. With a ``signals`` reporter, the
request's arrival (and a queue as it forms) go to the autoscaler's counts.
"""

from __future__ import annotations

import dataclasses
import functools
import json

from llmgw.core import engines, priorities
from llmgw.router import (
    admission,
    asgi,
    cold,
    errors,
    pick,
    prefix,
    proxying,
    ratelimit,
    request,
    tokenizers,
)
from llmgw.router import metering as router_metering
from llmgw.router import quota as router_quota
from llmgw.router import reports as router_events
from llmgw.router import signals as router_signals
from llmgw.router import tracing as router_tracing
from llmgw.router.asgi import CANCELS, authorization, header_value
from llmgw.router.policies import KEYED, TOKENED
from llmgw.router.table import ModelRoute, RouteTable, TableHolder

EMBEDDINGS_PATH = "/v1/embeddings"
PRIORITY_HEADER = priorities.HEADER.lower().encode()


class Completions:
    """Serves the forwarded paths (``app.FORWARD_PATHS``) with the parts the app owns."""

    def __init__(self, holder: TableHolder, *, proxy: proxying.Proxy, cold_hold: cold.ColdHold,
                 admission: admission.Admission, limiter: ratelimit.RateLimiter, source: str, max_body_bytes: int,
                 events: router_events.Sink | None = None, signals: router_signals.Reporter | None = None,
                 meter: router_metering.Meter | None = None, quota: router_quota.QuotaClient | None = None,
                 tokenizers: tokenizers.Tokenizers | None = None) -> None:
        self.holder = holder
        self._tokenizers = tokenizers  # kv_aware's, for a text prompt (None: only prompts sent as token ids)
        self._proxy = proxy
        self._cold = cold_hold
        self._admission = admission
        self._limiter = limiter
        self._source = source  # named in the 503 answered before the first table arrives
        self._max_body = max_body_bytes
        self._events = events
        self._signals = signals
        self._meter = meter  # None: nothing metered (no control plane to tell)
        self._quota = quota  # None: the per-router rpm/tpm window (``ratelimit``) instead of cluster budgets
        self._limits_seen: object = None
        # A new table's limits apply as it arrives: applied by the next request only, a replica that
        # turned Ready admitted nobody waiting until someone else came (and then a burst at once).
        holder.listen(self.apply_limits)

    async def _tokenized(self, key: pick.RequestKey, model: str, version: str, path: str,
                         doc: dict[str, object]) -> pick.RequestKey:
        """``key`` with the prompt's token ids from the model's tokenizer, once loaded (until then: as it was)."""
        assert self._tokenizers is not None
        found = self._tokenizers.get(model, version)
        ids = await tokenizers.prompt_ids(found, path, doc) if found is not None else None
        return dataclasses.replace(key, tokens=ids) if ids else key

    def apply_limits(self, table: RouteTable) -> None:
        if table.limits is not self._limits_seen:
            self._admission.set_limits(table.limits)
            self._limits_seen = table.limits

    async def complete(self, scope: asgi.Scope, path: str, arrived: float, receive: asgi.Receive,
                       send: asgi.Send) -> None:
        req = request.parse(await asgi.read_body(receive, limit=self._max_body))
        table = self.holder.current  # one snapshot for the whole request
        if not table.loaded:
            raise errors.table_not_loaded(self._source)
        header = authorization(scope)
        key = table.auth.identify(header)
        if isinstance(key, errors.ApiError):
            raise key  # before the lookup, so a 404 lists no models to a stranger
        if key.id and self._events is not None:
            self._events.key_used(key.id)  # the keys page's "last used"; a dict update, reported every few seconds
        route = table.lookup(req.model)
        if route is not None and key.project and not route.open_to(key.project):
            route = None  # restricted to other projects: answered as a model that does not exist, not a 403
        if route is None:
            raise errors.model_not_found(req.model, [n for m in table.auth.visible(key, table.models)
                                                     for n in m.public_names()])
        if not key.allows(route.name, route.served_name, *route.aliases):
            refused = table.auth.check(header, req.model, names=(route.name, route.served_name, *route.aliases))
            if isinstance(refused, errors.ApiError):
                raise refused
        queue_as = key.queue_as
        if asked := header_value(scope, PRIORITY_HEADER):  # a lower class asked for (issue 32)
            lowered = table.auth.classes.lowered(queue_as, asked)
            if isinstance(lowered, str):
                raise errors.ApiError(400, lowered, type="invalid_request_error", code="unknown_priority_class")
            queue_as = lowered
        if route.embeddings is False and path == EMBEDDINGS_PATH:
            # Said here, not by the engine's 501 (llama.cpp: "start it with --embeddings", a flag a client cannot set).
            found = engines.record(route.engine)
            raise errors.embeddings_not_served(req.model, route.engine,
                                               found.embeddings_flags[-1] if found and found.embeddings_flags else "")
        if self._quota is None:
            throttled = self._limiter.admit(key)
            if throttled is not None:
                raise throttled
            if key.tpm:
                send = self._counting(send, key.id)
            ticket = ratelimit = None
        else:
            ticket = self._quota.take(key, table.auth.projects, route, req)  # no budget: None, no await
            if isinstance(ticket, router_quota.Pending):
                ticket = await self._quota.wait(ticket)
            # The x-ratelimit-* headers ride on the answer's start (``proxying``), made as it is sent.
            ratelimit = functools.partial(self._quota.headers, ticket.plan) if ticket is not None else None
        # Metered when its record is kept, or its budgets settle on what it used; else nothing (issue 27).
        metered = (self._meter.start(key, route) if self._meter is not None and (self._meter.keeps or ticket)
                   else None)
        counts = None
        try:
            # Counted for the autoscaler under the model whose replicas serve it: an adapter's under its base, so
            # a request for an adapter of a base at zero wakes the base.
            counts = (self._signals.arrived(_scaled_name(table, route), arrived) if self._signals is not None
                      else None)
            started = held = False
            if not route.endpoints and route.autoscale is not None:
                # A model at zero: held here, not refused, until a replica is Ready (or its cold-start timeout).
                if ratelimit is not None:
                    send, ratelimit = router_quota.with_headers(send, ratelimit), None
                waited = await self._cold.hold(route, req, key, arrived, send, counts)
                if waited is None:
                    return  # answered already: the timeout's 503, or the model went away
                route, started = waited
                held = True
                table = self.holder.current
            self.apply_limits(table)
            # Hashing the prompt's blocks is for the routings that use them; round-robin skips it.
            affinity = (prefix.request_key(req.doc, session_header=header_value(scope, b"x-llmgw-session"),
                                           tokens=route.routing in TOKENED)
                        if route.routing in KEYED else pick.NO_KEY)
            if route.routing in TOKENED and not affinity.tokens and route.tokenizer and self._tokenizers is not None:
                affinity = await self._tokenized(affinity, route.name, route.tokenizer, path, req.doc)
            spans = router_tracing.CURRENT.get()
            if spans is not None:
                spans.admission_start()
            if (self._signals is not None and not self._admission.queued(route.name)
                    and self._admission.would_wait(route.name)):
                self._signals.queue_forming()  # the autoscaler hears of a queue as it forms, not an interval later
            async with self._admission.slot(route.name, priority=key.priority, queue_as=queue_as):
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
                await self._proxy.serve(route, req, path, arrived, receive, send, affinity,
                                        cancels=CANCELS in scope.get("extensions", ()), counts=counts,
                                        started=started, held=held, metered=metered, ratelimit=ratelimit)
        finally:
            # What it used: metered (its record kept) and charged to its budgets, what it reserved beyond back.
            if metered is not None:
                self._meter.close(metered)  # type: ignore[union-attr]
                if counts is not None:
                    counts.tokens_in += metered.prompt  # the UI's charts: tokens in, where metered
            if ticket is not None:
                assert self._quota is not None
                if metered is None:
                    self._quota.settle(ticket, 0, 0)
                else:
                    self._quota.settle(ticket, metered.tokens, metered.spend_micros)

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


def _usage_of(body: bytes) -> int:
    try:
        return ratelimit.usage_tokens(json.loads(body))
    except ValueError:
        return 0


def _scaled_name(table: RouteTable, route: ModelRoute) -> str:
    """The model whose replicas a request to ``route`` runs on: the base of an adapter, else the model itself."""
    if not route.parent:
        return route.name
    base = table.lookup(route.parent)
    return base.name if base is not None else route.name
