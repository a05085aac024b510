"""An engine's OpenAI chat completion stream rewritten, as it arrives, as Anthropic's Messages event stream.

``Events.feed`` takes the bytes the engine sent (SSE events, cut anywhere) and returns the Anthropic events
they make, each an SSE ``event:`` line and its ``data:``, in the order Anthropic sends them:

``message_start`` (then a ``ping``), for each content block ``content_block_start``, its
``content_block_delta``s (``text_delta``; a tool call's ``input_json_delta``) and ``content_block_stop``, then
``message_delta`` (``stop_reason``, ``stop_sequence``, the usage) and ``message_stop``. The router's keep-alive
comments become ``ping`` events; an error event (the engine's, or the router's when the engine failed
mid-stream) becomes Anthropic's ``error`` event and ends the stream. ``close`` ends a stream the engine cut
short without its ``[DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.router.anthropic import answer

Json = dict[str, Any]
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def event(kind: str, doc: Json) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


class Events:
    """One stream's translation: the blocks open so far, the finish reason and the usage seen."""

    def __init__(self, model: str, stops: list[str] | None) -> None:
        self._model = model
        self._stops = stops
        self._pending = b""
        self._started = False
        self._done = False
        self._index = -1  # the content block open now (-1: none yet)
        self._open: str | None = None  # "text", or "tool:<openai tool call index>"
        self._finish: object = None
        self._matched: object = None
        self._tools = False
        self._usage: object = None

    def feed(self, chunk: bytes) -> bytes:
        if self._done:
            return b""
        data = self._pending + chunk
        *events, self._pending = data.replace(b"\r\n", b"\n").split(b"\n\n")
        out = bytearray()
        for raw in events:
            out += self._event(raw)
            if self._done:
                break
        return bytes(out)

    def close(self) -> bytes:
        """What ends the stream when the engine's ended: the blocks closed, the message's delta and stop."""
        out = self.feed(b"\n\n") if self._pending.strip() else b""
        return out + self._finish_message()

    def _event(self, raw: bytes) -> bytes:
        lines = raw.split(b"\n")
        data = b"".join(line[5:].lstrip() for line in lines if line.startswith(b"data:"))
        if not data:
            if any(line.startswith(b":") for line in lines):
                return self._start() + PING  # the router's keep-alive: Anthropic's ping
            return b""
        if data == b"[DONE]":
            return self._finish_message()
        try:
            doc = json.loads(data)
        except ValueError:
            return b""
        if not isinstance(doc, dict):
            return b""
        if "error" in doc:
            return self._error(doc)
        out = self._start()
        if doc.get("usage"):
            self._usage = doc["usage"]
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict):
                out += self._choice(choice)
        return out

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message = {"id": answer.message_id(), "type": "message", "role": "assistant", "model": self._model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return event("message_start", {"type": "message_start", "message": message}) + PING

    def _choice(self, choice: Json) -> bytes:
        out = bytearray()
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open != "text":
                out += self._begin("text", {"type": "text", "text": ""})
            out += event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": {"type": "text_delta", "text": text}})
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._tool(call)
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
            self._matched = choice.get("stop_reason")
        return bytes(out)

    def _tool(self, call: Json) -> bytes:
        out = bytearray()
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        which = f"tool:{call.get('index', 0)}"
        if self._open != which:
            self._tools = True
            block = {"type": "tool_use", "id": str(call.get("id") or f"toolu_{answer.message_id()[4:]}"),
                     "name": str(function.get("name") or ""), "input": {}}
            out += self._begin(which, block)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": {"type": "input_json_delta", "partial_json": arguments}})
        return bytes(out)

    def _begin(self, which: str, block: Json) -> bytes:
        out = self._stop_block()
        self._index += 1
        self._open = which
        return out + event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                   "content_block": block})

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _finish_message(self) -> bytes:
        if self._done:
            return b""
        out = self._start() + self._stop_block()
        self._done = True
        reason, sequence = answer.stop_reason(self._finish, self._matched, self._stops, self._tools)
        used = answer.usage(self._usage)
        return out + event("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                             "usage": used}) + event("message_stop", {"type": "message_stop"})

    def _error(self, doc: Json) -> bytes:
        self._done = True
        inner = doc.get("error")
        message = inner.get("message") if isinstance(inner, dict) else inner
        code = inner.get("code") if isinstance(inner, dict) else None
        status = code if isinstance(code, int) else 500
        return event("error", answer.error(status, str(message or "The engine failed mid-stream."),
                                           code if isinstance(code, str) else None))
