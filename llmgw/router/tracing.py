"""OpenTelemetry tracing of forwarded requests, exported over OTLP/HTTP, only when asked for.

With ``--tracing-endpoint URL`` (env ``LLMGW_TRACING_ENDPOINT``) every forwarded
request becomes one trace of four kinds of span:

* ``router <path>`` (server): the whole request, arrival to the last byte sent,
  with the model, the answering replica and the HTTP status. A client's
  ``traceparent`` header is continued, so the router shows up inside the
  caller's trace;
* ``admission``: the wait for one of the model's slots (``admission``); a
  request refused with 429 ends it with an error;
* ``schedule``: from admission to the request handed to an engine (the pick,
  with the body rewritten for the engine);
* ``upstream`` (client), one per attempt: from the request sent to the last
  byte relayed, with an event at the first byte sent back to the client. The
  engine receives ``traceparent`` naming this span, so an engine that traces
  (vLLM with ``--otlp-traces-endpoint``) hangs its own spans under it.

Zero cost when off: no SDK is imported, ``RouterApp`` takes the plain path, and
the two hooks on the hot path (``admission``'s wait in ``completions``, the header in
``upstream``) read one context variable that holds None. When on, spans are
batched and exported from the SDK's own thread (``BatchSpanProcessor``), never on
the event loop; a collector that is down costs dropped spans, not latency.

``URL`` is the collector's base (``http://collector:4318``, ``/v1/traces`` is
added) or the full traces URL.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.router import asgi, errors

log = logging.getLogger(__name__)

#: The spans of the request the running task serves; None when tracing is off.
CURRENT: contextvars.ContextVar[RequestSpans | None] = contextvars.ContextVar("llmgw_router_spans", default=None)

Handler = Callable[[asgi.Scope, str, float, asgi.Receive, asgi.Send], Awaitable[None]]


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a collector base URL or a full traces URL."""
    url = endpoint.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"tracing endpoint {endpoint!r}: expected http://HOST:PORT (an OTLP/HTTP collector, "
                         "usually port 4318)")
    return url if url.endswith("/v1/traces") else url + "/v1/traces"


def _wall_ns(perf: float) -> int:
    """A ``perf_counter`` reading as nanoseconds since the epoch, which spans are stamped in."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


class Tracing:
    """The tracer provider and exporter; ``around`` traces one request."""

    def __init__(self, endpoint: str, *, service_name: str = "llmgw-router", schedule_delay_ms: int = 500,
                 exporter: Any = None) -> None:
        # Imported here: a router without tracing never loads the SDK.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.url = traces_url(endpoint)
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(
            exporter if exporter is not None else OTLPSpanExporter(endpoint=self.url),
            schedule_delay_millis=schedule_delay_ms))
        self.tracer = self._provider.get_tracer("llmgw.router")
        self._propagator = TraceContextTextMapPropagator()
        self.SpanKind, self.Status, self.StatusCode = SpanKind, Status, StatusCode
        self.in_context = set_span_in_context
        log.info("tracing: spans exported to %s", self.url)

    async def around(self, handler: Handler, scope: asgi.Scope, path: str, arrived: float,
                     receive: asgi.Receive, send: asgi.Send) -> None:
        """Run ``handler`` (the app's completion path) inside a request span."""
        carrier = {}
        for name, value in scope.get("headers", ()):
            if name in (b"traceparent", b"tracestate"):
                carrier[name.decode()] = bytes(value).decode("latin-1")
        root = self.tracer.start_span(f"router {path}", context=self._propagator.extract(carrier),
                                      kind=self.SpanKind.SERVER, start_time=_wall_ns(arrived),
                                      attributes={"http.request.method": "POST", "url.path": path})
        spans = RequestSpans(self, root)
        token = CURRENT.set(spans)
        try:
            await handler(scope, path, arrived, receive, spans.watching(send))
        except errors.ApiError as exc:  # answered by the app's caller with this status
            spans.status = exc.status
            raise
        finally:
            CURRENT.reset(token)
            spans.finish()

    async def shutdown(self) -> None:
        """Export what is pending and stop (in a thread: the SDK joins its exporter thread)."""
        await asyncio.to_thread(self._provider.shutdown)


class RequestSpans:
    """One request's spans; the app and the forwarder call in as the request moves along."""

    def __init__(self, tracing: Tracing, root: Any) -> None:
        self._t = tracing
        self.root = root
        self.status = 0
        self._admission_at = 0
        self._admitted_at = 0
        self._scheduled = False
        self._upstream: Any = None
        self._first_byte = False

    def admission_start(self) -> None:
        self._admission_at = time.time_ns()

    def admitted(self, model: str) -> None:
        self._admitted_at = now = time.time_ns()
        self.root.set_attribute("llmgw.model", model)
        span = self._t.tracer.start_span("admission", context=self._context(self.root), start_time=self._admission_at,
                                         attributes={"llmgw.model": model})
        span.end(end_time=now)

    def upstream(self, replica_id: str, url: str) -> str:
        """Start an attempt's span; the ``traceparent`` header value naming it, for the engine."""
        now = time.time_ns()
        if not self._scheduled:
            self._scheduled = True
            span = self._t.tracer.start_span("schedule", context=self._context(self.root),
                                             start_time=self._admitted_at or now,
                                             attributes={"llmgw.replica": replica_id})
            span.end(end_time=now)
        if self._upstream is not None:  # the previous attempt failed: this is a retry
            self._upstream.set_status(self._t.Status(self._t.StatusCode.ERROR, "retried on another endpoint"))
            self._upstream.end(end_time=now)
        self._upstream = self._t.tracer.start_span("upstream", context=self._context(self.root),
                                                   kind=self._t.SpanKind.CLIENT, start_time=now,
                                                   attributes={"llmgw.replica": replica_id, "server.address": url})
        self.root.set_attribute("llmgw.replica", replica_id)
        ctx = self._upstream.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def watching(self, send: asgi.Send) -> asgi.Send:
        """``send``, noting the status, the first byte and the end of the answer on the spans."""
        async def watched(message: asgi.Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                self.status = message.get("status", 0)
            elif kind == "http.response.body":
                if not self._first_byte and self._upstream is not None:
                    self._first_byte = True
                    self._upstream.add_event("first byte to the client")
                if not message.get("more_body", False) and self._upstream is not None:
                    self._upstream.end()
                    self._upstream = None
            await send(message)
        return watched

    def finish(self) -> None:
        now = time.time_ns()
        if self._admission_at and not self._admitted_at:
            # Refused while waiting (429) or the client left: the wait is the story.
            span = self._t.tracer.start_span("admission", context=self._context(self.root),
                                             start_time=self._admission_at)
            span.set_status(self._t.Status(self._t.StatusCode.ERROR, f"not admitted (HTTP {self.status or 499})"))
            span.end(end_time=now)
        if self._upstream is not None:
            self._upstream.end(end_time=now)
        status = self.status or 499  # no answer started: the client left first
        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(self._t.Status(self._t.StatusCode.ERROR, f"HTTP {status}"))
        self.root.end(end_time=now)

    def _context(self, span: Any) -> Any:
        return self._t.in_context(span)
