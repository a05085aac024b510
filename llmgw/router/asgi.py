"""Small ASGI helpers for the router: reading a body, watching for a disconnect, answering JSON.

The router is a raw ASGI app rather than a framework route: a framework's
request and response objects cost more per request than the proxying itself.
These helpers keep the raw message dicts in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llmgw.router import errors

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"

#: The scope extension a server sets when it cancels the request's task on disconnect (``server`` does).
CANCELS = "llmgw.cancel_on_disconnect"


class ClientGone(Exception):
    """The client disconnected before the router answered."""


async def read_body(receive: Receive, *, limit: int) -> bytes:
    """The whole request body; raise ``ClientGone`` on disconnect, a 413 ``ApiError`` past ``limit``."""
    # The router's own server (``connection.Connection``) has the body whole already: taken without a message.
    take = getattr(getattr(receive, "__self__", None), "take_body", None)
    if take is not None and (body := take()) is not None:
        if len(body) > limit:
            raise errors.body_too_large(limit)
        return body
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def authorization(scope: Scope) -> bytes | None:
    """The request's Authorization header, None without one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bytes(value)
    return None


def header_value(scope: Scope, wanted: bytes) -> str:
    """The request's header ``wanted`` (lower case), "" without one."""
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return bytes(value).decode("latin-1")
    return ""


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone; call only once the request body has been read."""
    while True:
        # Once the body is read, the server answers receive() only at disconnect (or
        # at the end of the response); any other message is skipped, not mistaken for one.
        if (await receive())["type"] == "http.disconnect":
            return


def start_message(status: int, content_type: bytes, *, length: int | None = None,
                  extra: list[tuple[bytes, bytes]] | None = None) -> Message:
    headers = [(b"content-type", content_type)]
    if length is not None:
        headers.append((b"content-length", b"%d" % length))
    if extra:
        headers.extend(extra)
    return {"type": "http.response.start", "status": status, "headers": headers}


async def send_bytes(send: Send, status: int, body: bytes, *, content_type: bytes = JSON,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    # The router's own server (``httphead.ResponseWriter``, whose bound ``_send`` this is when nothing wraps it)
    # writes a whole answer in one call, without the two messages (issue 27). A wrapped ``send`` (headers
    # added, tokens counted) is a plain function: it gets the messages.
    whole = getattr(getattr(send, "__self__", None), "send_whole", None)
    if whole is not None:
        await whole(status, content_type, body, extra)
        return
    await send(start_message(status, content_type, length=len(body), extra=extra))
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, error: errors.ApiError) -> None:
    await send_bytes(send, error.status, error.body())
