"""Relaying an engine's response to the client, once its headers have arrived.

A stream (``text/event-stream``) goes out chunk by chunk as each chunk arrives:
nothing is buffered, and each ASGI send is flushed by the server at once. The
chunks are not parsed; for an engine whose answers are not OpenAI's shape
(llama.cpp) a request's ``openai_shape.Plan`` splices them as they pass (a
byte splice, ~0.3 us a chunk: bench/README.md, "OpenAI shape"), and for every other
engine they go out as they came. A whole response is read and sent with its
length; an engine's error answer (status >= 400) is rebuilt as OpenAI's
ErrorResponse (``openai_errors.error_body``), whatever the engine wrote. Past this
point nothing is retried: bytes may have reached the client.

While a stream waits for its first chunk (a long prompt's prefill, a full
engine), an SSE comment ``: keep-alive`` goes out every ``keepalive_s``: proxies
and load balancers in front of the router close a connection idle for 60 s, and
a client would see a cut instead of a slow first token. Comments are ignored by
every SSE parser, OpenAI's included.

Each relay records its timings on the request's ``metrics.Trace``: TTFT at the
first engine chunk sent (keep-alives are not tokens), the gap between chunks,
and the router's own time from an upstream byte to the client. It also counts
the answer's output tokens for the autoscaler (``signals``): the usage the
engine wrote when the last bytes carry it, else one per SSE event (``data:``,
the ``[DONE]`` left out), a C-level count over bytes already in hand and no
parse: a stream's chunks are never decoded here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from llmgw.router import asgi, client, errors, metrics, openai_errors, openai_shape
from llmgw.router.table import Endpoint, ModelRoute

log = logging.getLogger(__name__)

SSE = b"text/event-stream"
KEEPALIVE = b": keep-alive\n\n"
_END: asgi.Message = {"type": "http.response.body", "body": b"", "more_body": False}
_DATA = b"data:"
_DONE = b"[DONE]"
_COMPLETION_TOKENS = b'"completion_tokens"'


def _ms(seconds: float) -> bytes:
    return b"%.3f" % (seconds * 1000)


def stream_start(*, overhead_s: float, endpoint: Endpoint | None = None, status: int = 200) -> asgi.Message:
    """The start of a streamed answer; ``endpoint`` is None when it goes out before one answered."""
    extra = [(b"cache-control", b"no-cache"), (b"x-llmgw-overhead-ms", _ms(overhead_s))]
    if endpoint is not None:
        extra.append((b"x-llmgw-upstream", endpoint.replica_id.encode()))
    return asgi.start_message(status, SSE, extra=extra)


async def keepalive(send: asgi.Send) -> None:
    await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})


async def error_event(send: asgi.Send, body: bytes) -> None:
    """End a started stream with ``body`` (an OpenAI error object) as its last event."""
    await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n", "more_body": True})
    await send(_END)


def body_sender(send: asgi.Send) -> Callable[[bytes, bool], Awaitable[None]]:
    """``send_body(body, more)``: the router's own server's writer called directly (no message per chunk, issue
    27), or, for any other ``send`` (a wrapped one, another server), the ``http.response.body`` message."""
    direct = getattr(getattr(send, "__self__", None), "send_body", None)
    if direct is not None:
        return direct  # type: ignore[no-any-return]

    async def via_message(body: bytes, more: bool) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": more})

    return via_message


async def _first_chunk(content: client.Response, send: asgi.Send, keepalive_s: float) -> bytes:
    if keepalive_s <= 0:
        return await content.readany()
    wait_any = getattr(content, "wait_any", None)
    if wait_any is not None:
        # ``client``'s body waits with a timer and no task: a chunk already there (the
        # usual case) costs nothing more than readany.
        while (chunk := await wait_any(keepalive_s)) is None:
            await keepalive(send)
        return chunk
    # A task waited on with a timeout rather than wait_for: a timed-out wait_for would
    # cancel the read, and the read is what must go on while the keep-alive goes out.
    read = asyncio.ensure_future(content.readany())
    try:
        while True:
            done, _ = await asyncio.wait((read,), timeout=keepalive_s)
            if done:
                return read.result()
            await keepalive(send)
    finally:
        if not read.done():  # the client left: the relay is being cancelled
            read.cancel()


async def stream(endpoint: Endpoint, response: client.Response, send: asgi.Send, trace: metrics.Trace,
                 *, keepalive_s: float = 0.0, started: bool = False, shape: openai_shape.Plan | None = None) -> None:
    """Relay an SSE response; ``started``: the 200 already went out (keep-alives while connecting).

    ``shape``: what the engine's chunks need to be OpenAI's (None: nothing, they pass as they are).
    """
    trace.replica = endpoint.replica_id
    shaper = shape.shaper(endpoint.replica_id) if shape is not None else None
    if not started:
        await send(stream_start(overhead_s=trace.before_upstream(), endpoint=endpoint, status=response.status))
        trace.status = response.status
    content = response.content
    events = 0
    tail = b""
    meter = trace.meter
    out = body_sender(send)
    try:
        first = await _first_chunk(content, send, keepalive_s)
        # From here the engine is generating: wait on it with the idle timeout, not the first-byte one.
        response.body_started()
        if first:
            tail = first
            events = first.count(_DATA)
            # client.Response says when the body has ended with what was just read: the
            # stream's end then goes out in the same write as its last bytes, not after.
            ended = getattr(content, "ended", None)
            received = time.perf_counter()
            final = ended is not None and ended()
            if meter is not None:
                first = meter.feed(first)  # the usage seen; the usage-only chunk the router asked for taken out
            if shaper is not None:
                first = shaper.feed(first) + (shaper.end() if final else b"")
            await out(first, not final)
            last = time.perf_counter()
            trace.first_chunk(received, last)
            if final:
                return
            itl = trace.series.itl
            async for chunk in content.iter_any():
                tail = chunk
                events += chunk.count(_DATA)
                final = ended is not None and ended()
                if meter is not None:
                    chunk = meter.feed(chunk)
                if shaper is not None:
                    chunk = shaper.feed(chunk) + (shaper.end() if final else b"")
                if not chunk and not final:
                    continue  # only part of a line came (the shaper keeps it), or only the usage asked for
                await out(chunk, not final)
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
                if final:
                    return
    except client.ClientError as exc:
        # Bytes already reached the client, so no retry: end the stream with an error
        # event, which OpenAI's clients raise, rather than a cut that looks complete.
        log.warning("replica %s at %s failed mid-stream: %s", endpoint.replica_id, endpoint.url, exc)
        error = errors.failed_mid_stream(endpoint.replica_id, str(exc) or type(exc).__name__)
        await error_event(send, error.body())
        return
    finally:
        if trace.signals is not None:
            trace.tokens = _stream_tokens(events, tail)
    rest = shaper.end() if shaper is not None else b""
    if rest:
        await send({"type": "http.response.body", "body": rest, "more_body": True})
    await send(_END)


async def whole(route: ModelRoute, endpoint: Endpoint, response: client.Response,
                send: asgi.Send, trace: metrics.Trace, *, shape: openai_shape.Plan | None = None) -> None:
    """Relay a whole response: an error rebuilt as OpenAI's ErrorResponse, a 200 spliced by ``shape``."""
    trace.replica = endpoint.replica_id
    try:
        body = await response.read()
    except client.ClientError as exc:
        failed = errors.upstream_failed(route.served_name, [f"{endpoint.replica_id} at {endpoint.url}: "
                                                            f"body cut short: {exc}"])
        trace.status = failed.status
        extra = trace.ratelimit() if trace.ratelimit is not None else None
        await asgi.send_bytes(send, failed.status, failed.body(), extra=extra or None)
        return
    received = time.perf_counter()
    content_type = response.headers.get("Content-Type", "application/json").encode("latin-1", "replace")
    if response.status >= 400:
        body = openai_errors.error_body(response.status, body, replica_id=endpoint.replica_id)
        content_type = asgi.JSON
    elif shape is not None and response.status == 200:
        body = shape.body(body)
    if trace.meter is not None and response.status == 200:
        trace.meter.whole(body)
    trace.status = response.status
    overhead = trace.before_upstream() + time.perf_counter() - received
    extra = [(b"x-llmgw-upstream", endpoint.replica_id.encode()), (b"x-llmgw-overhead-ms", _ms(overhead))]
    if trace.ratelimit is not None:
        extra += trace.ratelimit()  # the x-ratelimit-* headers (router.quota), as they stand now
    await asgi.send_bytes(send, response.status, body, content_type=content_type, extra=extra)
    sent = time.perf_counter()
    trace.own += sent - received
    trace.ttft = sent - trace.arrived
    if trace.signals is not None and response.status == 200:
        trace.tokens = completion_tokens(body) or 0
    if trace.held:
        trace.cold_started(sent)


def completion_tokens(data: bytes) -> int | None:
    """The ``usage.completion_tokens`` an answer's bytes carry, found without parsing them; None when absent."""
    at = data.rfind(_COMPLETION_TOKENS)
    if at < 0:
        return None
    at = data.find(b":", at + len(_COMPLETION_TOKENS))
    if at < 0:
        return None
    digits = data[at + 1:at + 24].lstrip()
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if end else None


def _stream_tokens(events: int, tail: bytes) -> int:
    # The usage of a stream asked with include_usage, when its last bytes carry it; else the events.
    used = completion_tokens(tail) if _COMPLETION_TOKENS in tail else None
    if used is not None:
        return used
    return max(0, events - (_DONE in tail))


async def as_event(endpoint: Endpoint, response: client.Response, send: asgi.Send,
                   trace: metrics.Trace) -> None:
    """A whole (error) answer to a stream whose 200 already went out: its body becomes the last event."""
    trace.replica = endpoint.replica_id
    try:
        body = (await response.read()).strip()
    except client.ClientError as exc:
        body = b""
        why = f"body cut short: {exc}"
    else:
        why = f"HTTP {response.status} with an empty body"
    # An engine's error in OpenAI's shape, whatever the engine wrote; a cut or empty one becomes ours.
    if body and response.status >= 400:
        body = openai_errors.error_body(response.status, body, replica_id=endpoint.replica_id)
    await error_event(send, body or errors.failed_mid_stream(endpoint.replica_id, why).body())
