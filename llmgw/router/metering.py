"""Metering: what each forwarded request used, as one ``api.usage.UsageRecord`` (issue 26).

``Meter.start`` gives a request its ``Metered`` (who asked, for which model, at which prices);
``proxying`` tells it which endpoint served (node and replica) and its outcome (status, TTFT,
duration); ``relay`` hands it the answer's bytes; ``Meter.close`` reads the engine's ``usage``,
counts it (Prometheus, by project and model) and hands the record to ``sink`` (the journal).

The tokens are the engine's own count (``usage``), never the router's guess, found cheaply:

- a whole answer: ``rfind(b'"usage"')`` and one ``raw_decode`` of that object, not a parse of the answer;
- a stream: each chunk read is only searched (``rfind``) for a usage object; the last one seen is
  decoded once, when the stream ends. When the client did not ask for usage
  (``stream_options.include_usage``), the router asks the engine for it (``ask_usage``) with
  ``continuous_usage_stats`` (vLLM's extension, and the sim's: usage so far on every chunk), and
  strips what it asked for from what the client gets: the usage-only last chunk (``"choices":[]``)
  and the ``usage`` field closing each chunk (a byte splice, no parse); a client that asked gets the
  stream as the engine wrote it. Stripped when the event arrives whole in one read (an engine writes
  each event at once); an event split across reads passes through.
- a client that leaves mid-stream is charged for what was generated: the last usage seen (with
  continuous usage, what was generated up to the last chunk relayed), else prompt unknown (0) and
  one completion token per content event relayed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from llmgw.router import metrics, request
from llmgw.router.auth import KeyInfo
from llmgw.router.table import Endpoint, ModelRoute

_USAGE = b'"usage"'
_NO_CHOICES = b'"choices":[]'
_USAGE_FIELD = b',"usage":'
_DATA = b"data:"
_DONE_END = b"[DONE]\n\n"
_DECODER = json.JSONDecoder()
#: The counts of a usage object (prompt/completion, the Responses API's input/output, cached), by name.
_COUNTS = re.compile(rb'"(prompt|completion|cached|input|output)_tokens"\s*:\s*(\d+)')
#: The paths whose streams take ``stream_options`` (the Responses API reports usage in its last event anyway).
STREAM_OPTION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_ASK = b'"stream_options":{"include_usage":true,"continuous_usage_stats":true},'
#: A usage object without a nested one (so no cached tokens), its prompt's count before its completion's (OpenAI's
#: order and vLLM's), from where ``_object_at`` finds its start: both counts in one match.
_FLAT = re.compile(rb'"usage"[ :\t]{0,8}\{[^{}]*?"prompt_tokens"\s*:\s*(\d+)[^{}]*?"completion_tokens"\s*:\s*(\d+)'
                   rb'[^{}]*\}')

#: A finished request's record: ``UsageRecord``'s fields in order, without ``seq`` (the journal numbers it).
#: A tuple, not the dataclass or a dict: made once per request, where a microsecond is a percent of capacity.
Record = tuple[Any, ...]


class Metered:
    """One request's metering: who, what, where, and the answer's usage as it passes."""

    __slots__ = ("at", "project", "key", "user", "model", "prices", "node", "replica", "strip", "events", "_last",
                 "_prev", "done", "prompt", "cached", "completion", "spend_micros", "status", "ttft_ms", "duration_ms",
                 "closed")

    def __init__(self, key: KeyInfo, route: ModelRoute, at: float) -> None:
        self.at = at
        self.project, self.key, self.user = key.project, key.id, key.user
        self.model = route.name
        self.prices = route.prices
        self.node = self.replica = ""
        self.strip = False  # the router asked for the usage: the usage-only last chunk is not the client's
        self.events = 0  # SSE events relayed: the completion count when no usage came
        self.done = 0  # 1: the stream's [DONE] was among them
        self._last: tuple[bytes, int] | None = None  # (bytes, offset of "usage") of the newest usage seen
        self._prev: tuple[bytes, int] | None = None
        self.prompt = self.cached = self.completion = self.spend_micros = 0
        self.status = 0  # 0: never forwarded (a cold hold that timed out, a client gone while held)
        self.ttft_ms = self.duration_ms = 0.0
        self.closed = False

    # -- on the way out ---------------------------------------------------------------------------------
    def ask_usage(self, req: request.CompletionRequest, path: str, body: bytes) -> bytes:
        """``body`` with usage asked for, when a stream's client did not ask itself; else ``body``."""
        if not req.stream or path not in STREAM_OPTION_PATHS:
            return body
        options = req.doc.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            return body  # the client asked: its stream passes as the engine writes it
        self.strip = True
        if "stream_options" not in req.doc:
            start = len(body) - len(body.lstrip(b" \t\r\n"))
            if body[start:start + 1] == b"{" and body[start + 1:start + 2] != b"\x00":
                return body[:start + 1] + _ASK + body[start + 1:]
        # Rare: stream_options given without include_usage (or a body not in UTF-8): written again.
        doc = json.loads(body)
        doc["stream_options"] = {**(options or {}), "include_usage": True, "continuous_usage_stats": True}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()

    def served_by(self, endpoint: Endpoint) -> None:
        self.node, self.replica = endpoint.node, endpoint.replica_id

    # -- the answer's bytes -----------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> bytes:
        """One stream read: remembered if it carries usage; without the usage the router asked for, if it did."""
        self.events += chunk.count(_DATA)
        if chunk.endswith(_DONE_END):
            self.done = 1
        at = chunk.rfind(_USAGE)
        if at < 0:
            return chunk
        if _object_at(chunk, at) >= 0:
            self._prev, self._last = self._last, (chunk, at)
        return self._stripped(chunk) if self.strip else chunk

    def _stripped(self, chunk: bytes) -> bytes:
        """``chunk`` without the usage-only event and the ``usage`` field ending each other event."""
        cut = chunk.find(_NO_CHOICES)
        if cut >= 0:
            start, end = chunk.rfind(_DATA, 0, cut), chunk.find(b"\n\n", cut)
            if start >= 0 and end >= 0:
                self.events -= 1
                chunk = chunk[:start] + chunk[end + 2:]
        # Continuous usage: a field at the end of each chunk's object (vLLM's and the sim's order); a
        # usage elsewhere in the object is left as it is.
        parts: list[bytes] = []
        pos = 0
        while (at := chunk.find(_USAGE_FIELD, pos)) >= 0:
            end = _field_end(chunk, at + len(_USAGE_FIELD))
            if end < 0:
                break
            parts.append(chunk[pos:at])
            pos = end
        if not parts:
            return chunk
        parts.append(chunk[pos:])
        return b"".join(parts)

    def whole(self, body: bytes) -> None:
        """A whole answer: its usage, found from the end."""
        at = body.rfind(_USAGE)
        if at >= 0:
            self._last = (body, at)

    def ended(self, status: int, replica: str, ttft_s: float, duration_s: float) -> None:
        """The request's outcome, as ``proxying`` saw it."""
        self.status = status
        self.replica = self.replica or replica
        # Milliseconds to 3 decimals: a whole number of microseconds over 1000 (the float nearest that decimal,
        # as ``round(ms, 3)`` gives, without its decimal conversion: a quarter of a microsecond per request).
        self.ttft_ms = round(ttft_s * 1e6) / 1000
        self.duration_ms = round(duration_s * 1e6) / 1000

    # -- the count --------------------------------------------------------------------------------------
    def count(self) -> None:
        """Reads the usage found (once): prompt, cached and completion tokens, and what they cost."""
        found = self._last
        usage = _usage(found[0], found[1]) if found is not None else None
        if usage is None and (found := self._prev) is not None:
            usage = _usage(found[0], found[1])
        if usage is not None:
            self.prompt, self.cached, self.completion = usage
        else:  # no usage: one token per event relayed, [DONE] not one
            self.completion = max(0, self.events - self.done)
        prices = self.prices
        if prices is not None:
            # ``Prices.spend_micros`` inline (counts here are >= 0 and cached <= prompt): per request.
            cached = self.cached
            self.spend_micros = round((self.prompt - cached) * prices.input_per_1m
                                      + cached * prices.cached_input_per_1m + self.completion * prices.output_per_1m)

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion


    def record(self) -> Record:
        return (self.at, self.project, self.key, self.user, self.model, self.node, self.replica, self.prompt,
                self.cached, self.completion, self.spend_micros, self.status, self.ttft_ms, self.duration_ms)


class Meter:
    """Starts and closes ``Metered`` requests; a closed one goes to ``sink`` (None: counted, not kept)."""

    def __init__(self, sink: Callable[[Record], None] | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._sink = sink
        self._clock = clock
        #: Whether closed requests are kept: without a sink, only a request with budgets to settle is metered.
        self.keeps = sink is not None

    def start(self, key: KeyInfo, route: ModelRoute) -> Metered:
        return Metered(key, route, self._clock())

    def close(self, metered: Metered) -> None:
        """The request is over: its tokens counted, its record kept (a request never forwarded has none)."""
        if metered.closed:
            return
        metered.closed = True
        metered.count()
        if not metered.status:
            return
        metrics.count_usage(metered.project, metered.model, metered.prompt, metered.completion)
        if self._sink is not None:
            self._sink(metered.record())


def _object_at(data: bytes, at: int) -> int:
    """Where the object of ``"usage":`` at ``at`` starts, or -1 (``null``, or cut off)."""
    i = at + len(_USAGE)
    end = min(len(data), i + 8)
    while i < end and data[i] in b" :\t":
        i += 1
    return i if i < len(data) and data[i] == 0x7B else -1  # "{"


def _field_end(chunk: bytes, start: int) -> int:
    """Where the usage object at ``start`` ends when it is its event's last field (the object's ``}`` follows),
    else -1. A usage object nests at most one object (``prompt_tokens_details``) and holds no strings with braces,
    so a few ``find``s tell, without a parse."""
    if chunk[start:start + 1] != b"{":
        return -1
    close = chunk.find(b"}", start)
    if close < 0:
        return -1
    if chunk.find(b"{", start + 1, close) >= 0:  # nested: the usage closes at the next "}"
        close = chunk.find(b"}", close + 1)
        if close < 0:
            return -1
    end = close + 1
    return end if chunk[end:end + 3] == b"}\n\n" else -1


def _usage(data: bytes, at: int) -> tuple[int, int, int] | None:
    """Prompt, cached and completion tokens of the usage object at ``at``; None when it is not readable.

    Each count found by name inside the object's bytes (a usage object holds only numbers and one nested
    object of them) by one regular expression, a third of a ``raw_decode``'s cost; ``raw_decode`` reads
    one that lacks them.
    """
    flat = _FLAT.match(data, at)
    if flat is not None and data.find(b"cached", at, flat.end()) < 0:
        prompt, completion = flat.groups()
        return int(prompt), 0, int(completion)  # {"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}
    start = _object_at(data, at)
    if start < 0:
        return None
    end = data.find(b"}", start)
    if end >= 0 and data.find(b"{", start + 1, end) >= 0:
        end = data.find(b"}", end + 1)
    if end >= 0:
        counts = dict(_COUNTS.findall(data, start, end))
        prompt, completion = counts.get(b"prompt", counts.get(b"input")), counts.get(b"completion",
                                                                                    counts.get(b"output"))
        if prompt is not None and completion is not None:
            p = int(prompt)
            return p, min(int(counts.get(b"cached", 0)), p), int(completion)
    try:
        usage, _ = _DECODER.raw_decode(data[start:start + 4096].decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return prompt, min(cached, prompt), completion


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
