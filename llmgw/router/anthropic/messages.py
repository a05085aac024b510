"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API on the router's path.

``Messages.serve`` reads the body and hands it to the same path a client's ``/v1/chat/completions`` takes
(``completions.Completions.complete``: the key, the model's lookup, budgets and rate limits, a model held at
zero, admission, routing, metering). A model whose engine serves the Messages API itself (the engine record's
``anthropic_messages``, ``core.engines``: vLLM) gets the request as it came, on the same path at the engine;
any other gets it turned into a chat completion request (``convert``) on ``/v1/chat/completions``. Either way

* the body the path reads is the one to send,
* the key taken from ``x-api-key`` when there is no ``Authorization`` header (the Anthropic SDK and Claude
  Code send ``x-api-key``), as an ``Authorization: Bearer`` header on the request's scope,
* ``send`` wrapped by ``Reply``: translated, a stream's events rewritten as they pass (``events``) and a
  whole answer (``answer.message``, or a count_tokens answer) once whole; passed through, the engine's answer
  as it is but for the router's own mid-stream error event, named ``error`` as Anthropic's; and every error
  (the router's own refusals, the engine's, which ``relay`` makes OpenAI-shaped) in Anthropic's shape.

``anthropic-version`` and ``anthropic-beta`` are accepted and not checked. The chat routes are untouched:
this module runs only for its two paths.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.core import engines
from llmgw.router import admission, asgi, errors, metrics, ratelimit
from llmgw.router.anthropic import answer, convert
from llmgw.router.anthropic.events import Events
from llmgw.router.table import TableHolder

MESSAGES_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
PATHS = frozenset({MESSAGES_PATH, COUNT_PATH})
CHAT_PATH = "/v1/chat/completions"

Complete = Callable[[asgi.Scope, str, float, asgi.Receive, asgi.Send], Awaitable[None]]


class Messages:
    """Serves ``PATHS`` through ``complete``, the chat completions path."""

    def __init__(self, holder: TableHolder, complete: Complete, *, max_body_bytes: int) -> None:
        self._holder = holder
        self._complete = complete
        self._max_body = max_body_bytes

    async def serve(self, scope: asgi.Scope, path: str, arrived: float, receive: asgi.Receive,
                    send: asgi.Send) -> None:
        try:
            if scope["method"] != "POST":
                raise errors.method_not_allowed(scope["method"], path, "POST")
            body = await asgi.read_body(receive, limit=self._max_body)
            doc = _decode(body)
            count = path == COUNT_PATH
            if self._native(doc.get("model")):
                reply = Reply(send, model="", stops=None, count=count, native=True)
                await self._complete(with_key(scope), path, arrived, _replaced(receive, body), reply.send)
                return
            chat = convert.to_chat(doc, count_only=count)
            reply = Reply(send, model=chat["model"], stops=chat.get("stop"), count=count)
            body = json.dumps(chat, ensure_ascii=False, separators=(",", ":")).encode()
            await self._complete(with_key(scope), CHAT_PATH, arrived, _replaced(receive, body), reply.send)
        except errors.ApiError as exc:  # raised only before the answer started
            metrics.count_request("", "", exc.status)  # as the app counts the chat routes' refusals: model=""
            extra = exc.headers() if isinstance(exc, ratelimit.Throttled | admission.Overloaded
                                                | errors.ColdStartTimeout) else None
            await asgi.send_bytes(send, exc.status,
                                  json.dumps(answer.error(exc.status, _for_anthropic(exc), exc.code)).encode(),
                                  extra=extra)

    def _native(self, model: object) -> bool:
        """Whether ``model``'s engine serves the Messages API itself (the lookup the path makes again)."""
        route = self._holder.current.lookup(model) if isinstance(model, str) else None
        found = engines.ENGINES.get(route.engine) if route is not None else None
        return found is not None and found.anthropic_messages


def _decode(body: bytes) -> dict[str, Any]:
    if not body:
        raise errors.invalid_request("The request body is empty; send a JSON Messages request "
                                     "(model, max_tokens, messages).")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise errors.invalid_request(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(doc, dict):
        raise errors.invalid_request(f"The request body must be a JSON object, not {type(doc).__name__}.")
    return doc


def _for_anthropic(exc: errors.ApiError) -> str:
    if exc.status == 401:
        return exc.message + " Anthropic clients: send the llmgw key as x-api-key (ANTHROPIC_API_KEY)."
    return exc.message


def with_key(scope: asgi.Scope) -> asgi.Scope:
    """``scope``, with ``x-api-key`` as ``Authorization: Bearer`` when it has no Authorization header."""
    key = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return scope
        if name == b"x-api-key":
            key = value
    if key is None:
        return scope
    inner = dict(scope)
    inner["headers"] = [*scope["headers"], (b"authorization", b"Bearer " + bytes(key))]
    return inner


def _replaced(receive: asgi.Receive, body: bytes) -> asgi.Receive:
    """A ``receive`` whose first message is ``body``, whole; later calls are the client's (its disconnect)."""
    sent = False

    async def replaced() -> asgi.Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaced


class Reply:
    """The client's ``send``, behind which the engine's answer is rewritten in Anthropic's shapes."""

    def __init__(self, send: asgi.Send, *, model: str, stops: list[str] | None, count: bool,
                 native: bool = False) -> None:
        self._send = send
        self._native = native  # the engine answers in Anthropic's shapes: only errors are rewritten
        self._model = model
        self._stops = stops
        self._count = count
        self._start: asgi.Message | None = None
        self._events: Events | None = None
        self._whole: list[bytes] = []
        self._passing = False

    async def send(self, message: asgi.Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", ()) if k != b"content-length"]
            sse = message["status"] == 200 and any(
                k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
            if self._native and message["status"] == 200:
                self._passing = True
                await self._send(message)
            elif sse and not self._count:
                self._events = Events(self._model, self._stops)
                await self._send({**message, "headers": headers})
            else:
                self._start = {**message, "headers": headers}
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if self._passing:
            if chunk.startswith(b'data: {"error"'):  # the router's own (``relay.error_event``): named as Anthropic's
                chunk = Events("", None).feed(chunk)
            await self._send({**message, "body": chunk})
            return
        if self._events is not None:
            out = self._events.feed(chunk) if chunk else b""
            if not more:
                out += self._events.close()
            if out or not more:
                await self._send({"type": "http.response.body", "body": out, "more_body": more})
            return
        self._whole.append(chunk)
        if not more:
            await self._answer(b"".join(self._whole))

    async def _answer(self, body: bytes) -> None:
        assert self._start is not None
        status = self._start["status"]
        if status == 200:
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                message = answer.message(doc, self._model, self._stops)
                out = message["usage"] if self._count else message
                if self._count:
                    out = {"input_tokens": out["input_tokens"] + out["cache_read_input_tokens"]}
                body = json.dumps(out, ensure_ascii=False).encode()
            else:
                status, body = 502, json.dumps(answer.error(502, "The engine's answer was not JSON.")).encode()
        else:
            body = answer.error_body(status, body)
        headers = [(k, v) for k, v in self._start["headers"] if k != b"content-type"]
        headers += [(b"content-type", asgi.JSON), (b"content-length", b"%d" % len(body))]
        await self._send({**self._start, "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
