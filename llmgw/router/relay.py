"""Relaying an engine's response to the client, once its headers have arrived.

A stream (``text/event-stream``) goes out chunk by chunk as each chunk arrives:
nothing is buffered, and each ASGI send is flushed by the server at once. The
chunks are not parsed or rewritten; that would cost per token on the hot path
(DESIGN.md: measure before doing it). A whole response is read and sent with its
length. Past this point nothing is retried: bytes may have reached the client.
"""

from __future__ import annotations

import logging

import aiohttp

from llmgw.router import asgi, errors
from llmgw.router.table import Endpoint, ModelRoute

log = logging.getLogger(__name__)

SSE = b"text/event-stream"


def _upstream_header(endpoint: Endpoint) -> list[tuple[bytes, bytes]]:
    return [(b"x-llmgw-upstream", endpoint.replica_id.encode())]


async def stream(endpoint: Endpoint, response: aiohttp.ClientResponse, send: asgi.Send) -> None:
    extra = [(b"cache-control", b"no-cache"), *_upstream_header(endpoint)]
    await send(asgi.start_message(response.status, SSE, extra=extra))
    try:
        async for chunk in response.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except aiohttp.ClientError as exc:
        # Bytes already reached the client, so no retry: end the stream with an error
        # event, which OpenAI's clients raise, rather than a cut that looks complete.
        log.warning("replica %s at %s failed mid-stream: %s", endpoint.replica_id, endpoint.url, exc)
        error = errors.failed_mid_stream(endpoint.replica_id, str(exc) or type(exc).__name__)
        await send({"type": "http.response.body", "body": b"data: " + error.body() + b"\n\n",
                    "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def whole(route: ModelRoute, endpoint: Endpoint, response: aiohttp.ClientResponse,
                send: asgi.Send) -> None:
    try:
        body = await response.read()
    except aiohttp.ClientError as exc:
        failed = errors.upstream_failed(route.served_name, [f"{endpoint.replica_id} at {endpoint.url}: "
                                                            f"body cut short: {exc}"])
        await asgi.send_error(send, failed)
        return
    content_type = response.headers.get("Content-Type", "application/json").encode("latin-1", "replace")
    await asgi.send_bytes(send, response.status, body, content_type=content_type,
                          extra=_upstream_header(endpoint))
