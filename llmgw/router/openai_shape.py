"""Engine answers in OpenAI's shape: every error body rebuilt, llama.cpp's completions spliced.

**Errors** (any engine's error body rebuilt as OpenAI's ``ErrorResponse``) are the job of
``openai_errors``; an ``{"error": ...}`` event inside a stream is rebuilt the same way here (``Shaper``).

**Successes from llama.cpp** (xllamacpp 2026.10, checked against
llmgw/testing/openai/schemas.json; the sim already conforms, and vLLM's chunks
do; its whole chat answers lose the keys it sends as null, ``drop_null_keys``):

* required by the schema: a chat answer's ``choices[].logprobs`` and
  ``message.refusal`` (absent), and with ``logprobs`` asked, the logprobs
  object's ``refusal`` (absent, stream and not); a completions stream for a
  list of prompts starts with a ``data: null`` event (dropped);
* OpenAI's behaviour, not required by the schema (chunks without them
  validate): ``"logprobs":null`` in every chat chunk's choice, and with
  ``stream_options.include_usage`` ``"usage":null`` on every chunk but the
  last and, for completions, the usage in a final ``"choices":[]`` chunk
  (llama.cpp puts it on the last choice's chunk);
* one ``created`` per stream (OpenAI: "each chunk has the same timestamp"):
  llama.cpp stamps each chunk with the second it was written, so a stream that
  crosses a second changes it; every chunk gets its stream's first one (vLLM
  stamps once per stream; SGLang, relayed untouched too, stamps each chunk, its
  serving_chat.py's ``created=int(time.time())``: not mended here).

These are byte splices at known positions, not parse-and-dump: the common chunk
(one event, as llama.cpp writes it) costs a ``find``, a ``startswith``, a slice
compared and a concatenation, ~0.4 us against ~6 us to parse and dump it (bench/README.md,
"OpenAI shape"). A chunk with something unusual (an error, usage, logprobs, other
spacing) goes line by line, and only the completions chunk whose usage moves is
parsed (once per stream). ``plan`` decides once per request what applies; an
engine that conforms gets None and the relay touches nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from llmgw.core import engines
from llmgw.router.openai_errors import error_body

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

# -- successes: the plan, made once per request --


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What a request's answer needs to be OpenAI's shape; ``plan`` makes one."""

    chat: bool  # chat completions (else completions)
    logprobs: bool  # the request asked for logprobs: events carry logprobs objects
    include_usage: bool  # stream_options.include_usage: usage null on every chunk, then a usage chunk
    prompt_list: bool  # completions for a list of prompts: llama.cpp starts the stream with ``data: null``
    #: Keys of a whole chat answer to drop when null (the engine record's ``openai_null_keys``).
    null_keys: tuple[str, ...] = ()

    def body(self, body: bytes) -> bytes:
        """A whole 200 answer's ``body`` in OpenAI's shape."""
        if self.null_keys:
            return drop_null_keys(body, self.null_keys)
        return chat_body(body) if self.chat else body

    def shaper(self, replica_id: str) -> Shaper:
        return Shaper(self, replica_id)


def plan(engine: str, path: str, doc: Mapping[str, Any]) -> Plan | None:
    """What ``engine``'s answer to ``doc`` on ``path`` needs; None when nothing (the hot path untouched)."""
    # Whether its successful answers need splicing is the engine's record's; the others conform.
    # The registry is read directly: this runs on every request (bench/openai_shape_cost.py).
    found = engines.ENGINES.get(engine)
    if found is None or path not in (CHAT_PATH, COMPLETIONS_PATH):
        return None
    if not found.openai_shapes_needed:
        if found.openai_null_keys and path == CHAT_PATH and doc.get("stream") is not True:
            return _null_plan(found.openai_null_keys)
        return None
    options = doc.get("stream_options")
    logprobs = doc.get("logprobs")
    return _plan(path == CHAT_PATH, logprobs is not None and logprobs is not False and logprobs != 0,
                 options is not None and isinstance(options, Mapping) and options.get("include_usage") is True,
                 isinstance(doc.get("prompt"), list))


@functools.cache
def _plan(chat: bool, logprobs: bool, include_usage: bool, prompt_list: bool) -> Plan:
    # Sixteen possible plans, each built once: a frozen dataclass costs ~0.5 us to construct.
    return Plan(chat=chat, logprobs=logprobs, include_usage=include_usage, prompt_list=prompt_list)


@functools.cache
def _null_plan(keys: tuple[str, ...]) -> Plan:
    return Plan(chat=True, logprobs=False, include_usage=False, prompt_list=False, null_keys=keys)


def drop_null_keys(body: bytes, keys: tuple[str, ...]) -> bytes:
    """A chat answer without ``keys`` where they are null: at its top, in its usage, in a choice's message.

    vLLM 0.32 writes ``"annotations":null`` and ``"function_call":null`` in each
    message, ``"prompt_tokens_details":null`` in the usage and a null
    ``system_fingerprint`` (pydantic's ``model_dump`` of its response), where OpenAI's
    schema has an array or an object (or leaves the key out): a client that
    validates, or iterates ``message.annotations``, fails on them. Whole answers
    only (a generation's one body, so the parse is nothing against it); a body
    that holds none of them is passed on untouched.
    """
    if not _null_pattern(keys).search(body):
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    places = [doc, doc.get("usage"), *(c.get("message") for c in doc.get("choices") or () if isinstance(c, dict))]
    for place in places:
        if isinstance(place, dict):
            for key in keys:
                if key in place and place[key] is None:
                    del place[key]
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


@functools.cache
def _null_pattern(keys: tuple[str, ...]) -> re.Pattern[bytes]:
    return re.compile(rb'"(?:' + b"|".join(re.escape(k.encode()) for k in keys) + rb')"\s*:\s*null')


# -- the splices --

_CHOICE = b'{"choices":[{'
_DATA = b"data: "
_DATA_CHOICE = _DATA + _CHOICE
_DATA_CHOICE_LEN = len(_DATA_CHOICE)
_DONE = b"data: [DONE]\n\n"
_CHOICE_LOGPROBS = b'{"choices":[{"logprobs":null,'
_CHOICE_USAGE_LOGPROBS = b'{"usage":null,"choices":[{"logprobs":null,'
_LOGPROBS_OBJECT = b'"logprobs":{"content":'
_LOGPROBS_REFUSAL = b'"logprobs":{"refusal":null,"content":'
_MESSAGE = b'"message":{'
_MESSAGE_REFUSAL = b'"message":{"refusal":null,'
# The same places with any JSON whitespace, for bytes not written as llama.cpp writes them.
_CHOICE_ANY = re.compile(rb'("choices"\s*:\s*\[\s*\{)')
_LOGPROBS_OBJECT_ANY = re.compile(rb'("logprobs"\s*:\s*\{)')
_ERROR_ANY = re.compile(rb'^\s*\{\s*"error"\s*:')
_KEY_LOGPROBS = re.compile(rb'"logprobs"\s*:')
_KEY_REFUSAL = re.compile(rb'"refusal"\s*:')
_KEY_USAGE = re.compile(rb'"usage"\s*:')
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
# ``"created":`` cannot occur inside a JSON string (its quotes would be escaped), so the first one is the key.
_CREATED = b'"created":'
_CREATED_LEN = len(_CREATED)
_CREATED_ANY = re.compile(rb'("created"\s*:\s*)(\d+)')
_DIGITS = re.compile(rb"\d+")
#: ``Shaper._created_key`` until the stream's first ``created`` is seen: matches no chunk.
_NO_CREATED = b"\0"


def chat_body(body: bytes) -> bytes:
    """A llama.cpp chat answer with ``choices[].logprobs``, ``message.refusal`` (and ``logprobs.refusal``)."""
    if body.startswith(_CHOICE) and body.count(_MESSAGE) == 1 and b'"refusal"' not in body:
        # llama.cpp's own bytes, one choice (it refuses n > 1): two splices.
        if b'"logprobs":' not in body:
            body = _CHOICE_LOGPROBS + body[len(_CHOICE):]
        else:  # asked for: its object lacks the refusal
            body = body.replace(_LOGPROBS_OBJECT, _LOGPROBS_REFUSAL)
        return body.replace(_MESSAGE, _MESSAGE_REFUSAL)
    try:  # anything else: the rare path, parsed
        doc = json.loads(body)
    except ValueError:
        return body
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return body
    for choice in choices:
        if isinstance(choice, dict):
            choice.setdefault("logprobs", None)
            if isinstance(choice["logprobs"], dict):
                choice["logprobs"].setdefault("refusal", None)
            if isinstance(choice.get("message"), dict):
                choice["message"].setdefault("refusal", None)
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _insert_after(data: bytes, pattern: re.Pattern[bytes], text: bytes) -> bytes:
    return pattern.sub(lambda m: m.group(1) + text, data, count=1)


def chat_data(data: bytes, *, include_usage: bool) -> bytes:
    """One chat chunk's JSON (any spacing): logprobs null or its refusal, and usage null if asked."""
    found = _LOGPROBS_OBJECT_ANY.search(data)
    if found is not None:
        # llama.cpp writes the logprobs object after the delta, so a refusal past its brace is its own.
        if not _KEY_REFUSAL.search(data, found.end()):
            data = data[:found.end()] + b'"refusal":null,' + data[found.end():]
    elif not _KEY_LOGPROBS.search(data):
        data = _insert_after(data, _CHOICE_ANY, b'"logprobs":null,')
    if include_usage and not _KEY_USAGE.search(data):
        data = _insert_at_open(data, b'"usage":null,')
    return data


def _insert_at_open(data: bytes, text: bytes) -> bytes:
    i = data.find(b"{")
    return data if i < 0 else data[:i + 1] + text + data[i + 1:]


def completion_data(data: bytes, *, include_usage: bool) -> list[bytes]:
    """One completions chunk's JSON as the events OpenAI sends: usage null, or usage in its own last chunk."""
    if not include_usage:
        return [data]
    if not _KEY_USAGE.search(data):
        return [_insert_at_open(data, b'"usage":null,')]
    if _EMPTY_CHOICES.search(data):
        return [data]
    try:  # once per stream: the usage leaves the last choice's chunk for a "choices": [] one
        doc = json.loads(data)
    except ValueError:
        return [data]
    if not isinstance(doc, dict):
        return [data]
    usage = doc.pop("usage")
    doc["usage"] = None
    tail = {k: doc[k] for k in ("id", "object", "created", "model", "system_fingerprint") if k in doc}
    tail.update(choices=[], usage=usage)
    return [json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode() for d in (doc, tail)]


class Shaper:
    """Splices one stream's chunks as they pass; ``feed`` each chunk, ``end`` at the end of the stream.

    The usual chunk is one whole event as llama.cpp writes it (``data: {"choices":[{``...):
    one ``find``, one ``startswith`` and a concatenation (measured: bench/README.md). A
    chunk of several events is split into them; anything else (an error, a usage,
    logprobs, other spacing, ``[DONE]``) goes line by line. A line is spliced whole:
    the bytes after a chunk's last newline wait for the next chunk (a part of an
    event, which no SSE client could use yet).

    Every event's ``created`` becomes the stream's first. llama.cpp writes the same
    keys after it in each chunk of a stream, so it lies at the same distance from the
    chunk's end: a slice and a comparison find it unchanged, and a chunk written in a
    later second is one more comparison and a concatenation (a ``find`` and a check
    of the digits once a second, or for a chunk laid out otherwise). A later value
    that starts with the first's digits and has more would pass: ten times later.
    """

    def __init__(self, plan: Plan, replica_id: str) -> None:
        self._plan = plan
        self._replica_id = replica_id
        self._carry = b""
        self._drop_blank = False  # a dropped event's blank line may come in the next chunk
        # The usual event's new start; None: every event line by line.
        self._start: bytes | None = None
        if plan.chat and not plan.logprobs:
            self._start = _DATA + (_CHOICE_USAGE_LOGPROBS if plan.include_usage else _CHOICE_LOGPROBS)
        elif not plan.chat and not plan.include_usage and not plan.prompt_list:
            self._start = _DATA_CHOICE  # llama.cpp's completions chunks already conform
        # A chat chunk that carries usage must not get a second ``"usage":null`` (llama.cpp sends
        # usage only in a ``"choices":[]`` chunk, which the fast path never matches, but be sure).
        self._check_usage = plan.chat and plan.include_usage
        # ``"created":`` and the stream's first value as llama.cpp wrote it (_NO_CREATED until seen), its
        # digits alone, and where it lies as negative indices: llama.cpp writes the same keys after it in
        # every chunk of a stream (id, model, object). 0, 0 until seen: an empty slice, matching no key.
        self._created_key, self._created = _NO_CREATED, b""
        self._created_at = self._created_to = 0
        #: The later ``"created":`` value llama.cpp writes now, seen in that place: replaced without a check.
        self._engine_key = _NO_CREATED

    def feed(self, chunk: bytes) -> bytes:
        if self._carry:
            chunk, self._carry = self._carry + chunk, b""
        if chunk.find(b"\n") == len(chunk) - 2 and chunk[-1] == 10:  # the usual chunk: one whole event
            start = self._start
            if (start is not None and chunk.startswith(_DATA_CHOICE)
                    and not (self._check_usage and b'"usage"' in chunk)):
                # _usual inlined (the hot path): created where llama.cpp writes it, the first's or a known later one.
                at, to = self._created_at, self._created_to
                created = chunk[at:to]
                if created == self._created_key:
                    return chunk if start is _DATA_CHOICE else start + chunk[_DATA_CHOICE_LEN:]
                if created == self._engine_key:
                    head = chunk[:at] if start is _DATA_CHOICE else start + chunk[_DATA_CHOICE_LEN:at]
                    return head + self._created_key + chunk[to:]
                return self._usual(chunk, start)
            return self._event(chunk)
        if not chunk.endswith(b"\n"):
            cut = chunk.rfind(b"\n") + 1
            chunk, self._carry = chunk[:cut], chunk[cut:]
            if not chunk:
                return b""
        if chunk.endswith(b"\n\n"):
            start = self._start
            if start is not None and not (self._check_usage and b'"usage"' in chunk):
                # Several events read at once: when each is a usual one (or the last is [DONE]),
                # one replace splices them all. ``data: {"choices":[{`` cannot occur inside a JSON
                # string (its quotes would be escaped); text with "data:" in it only costs the slow way.
                usual = chunk.count(_DATA_CHOICE)
                if usual + chunk.endswith(_DONE) == chunk.count(b"data:"):
                    known = chunk.count(self._created_key)  # each of llama.cpp's has one created
                    if known != usual:
                        if known + chunk.count(self._engine_key) == usual:  # a later second's, all known
                            chunk = chunk.replace(self._engine_key, self._created_key)
                        else:
                            chunk = self._stamp_all(chunk)
                    return chunk if start is _DATA_CHOICE else chunk.replace(_DATA_CHOICE, start)
            return b"".join([self._event(e + b"\n\n") for e in chunk[:-2].split(b"\n\n")])
        return self._lines(chunk)

    def _event(self, event: bytes) -> bytes:
        """One whole event (its blank line included)."""
        start = self._start
        if (start is not None and event.startswith(_DATA_CHOICE)
                and not (self._check_usage and b'"usage"' in event)):
            return self._usual(event, start)
        if event == _DONE:
            return event
        return self._lines(event)

    def _usual(self, event: bytes, start: bytes) -> bytes:
        """One event as llama.cpp writes it (``data: {"choices":[{``...), its start and created spliced."""
        if event[self._created_at:self._created_to] != self._created_key:
            event = self._stamp(event)
        return event if start is _DATA_CHOICE else start + event[_DATA_CHOICE_LEN:]

    def _stamp(self, event: bytes) -> bytes:
        """One usual ``event`` with the stream's first ``created``; the first is remembered."""
        n = len(event)
        at, to = self._created_at, self._created_to
        if (self._created and event[at:at + _CREATED_LEN] == _CREATED and event[at + _CREATED_LEN:to].isdigit()
                and not event[to:to + 1].isdigit()):  # to is at most -3: the event ends ``}\n\n``
            self._engine_key = event[at:to]  # where the first was: a later second, the same until the next
            return event[:at] + self._created_key + event[to:]
        at = event.find(_CREATED, _DATA_CHOICE_LEN)
        digits = _DIGITS.match(event, at + _CREATED_LEN) if at > 0 else None
        if digits is None:
            return event  # no created, or not a number: not llama.cpp's, left alone
        first = not self._created
        if first:
            self._created_key, self._created = event[at:digits.end()], digits.group()
        if first or not self._created_at and digits.end() - digits.start() == len(self._created):
            self._created_at, self._created_to = at - n, digits.end() - n
        if first:
            return event
        return event[:at + _CREATED_LEN] + self._created + event[digits.end():]

    def _stamp_all(self, data: bytes) -> bytes:
        """``data`` (any number of events, any spacing) with every ``created`` the stream's first."""
        if not self._created:
            found = _CREATED_ANY.search(data)
            if found is None:
                return data
            self._created = found.group(2)
            self._created_key = _CREATED + self._created  # its place from the end is found by _stamp
        created = self._created
        return _CREATED_ANY.sub(lambda m: m.group(1) + created, data)

    def end(self) -> bytes:
        """What is left at the end of the stream (a last line without its newline), spliced."""
        rest, self._carry = self._carry, b""
        return self._lines(rest) if rest else b""

    def _lines(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        lines = chunk.split(b"\n")
        last = len(lines) - 1  # after the chunk's last newline: nothing, or what end() flushes
        for i, line in enumerate(lines):
            if self._drop_blank and i < last:
                self._drop_blank = False
                if not line.strip():
                    continue  # the dropped event's blank line goes with it
            shaped = self._line(line)
            if shaped is None:
                self._drop_blank = True
                continue
            out.append(shaped)
        return b"\n".join(out)

    def _line(self, line: bytes) -> bytes | None:
        if not line.startswith(b"data:"):
            return line
        data = line[5:].strip()
        if not data.startswith(b"{"):
            return None if data == b"null" else line  # [DONE] stays; llama.cpp's ``data: null`` goes
        if _ERROR_ANY.match(data):
            return b"data: " + _error_event(data, self._replica_id)
        plan = self._plan
        if plan.chat:
            return b"data: " + self._stamp_all(chat_data(data, include_usage=plan.include_usage))
        events = completion_data(data, include_usage=plan.include_usage)
        return b"\n\n".join(b"data: " + self._stamp_all(e) for e in events)


def _error_event(data: bytes, replica_id: str) -> bytes:
    """An ``{"error": ...}`` event inside a stream, rebuilt; its status is the one its code gives, else 500."""
    try:
        code = json.loads(data)["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        code = None
    status = code if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 else 500
    return error_body(status, data, replica_id=replica_id)
