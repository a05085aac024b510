"""Steady traffic through a router with the real ``openai`` client, counted per phase, its URL switchable.

For the rolling-upgrade test: one client thread per (model, streamed or not) sends chat completions one after
another (``pace_s`` apart at most) for as long as the test runs, and every request is counted in the phase
that was current when it started: served, or failed with why. A failure is an exception (a refused
connection, a cut stream, a status that is not 200: the client never retries, ``max_retries=0``), a stream
that ended without its final chunk (one with a ``finish_reason``), or an answer with no choice that finished.

``switch(url)`` moves the clients to another router between requests: a request is sent to whichever URL is
current when it starts, and ``switch`` returns once no request sent to the old URL is still waiting for its
answer's first line, so the old router can then stop listening without refusing anyone; what it still has
open is its graceful shutdown's to finish. ``HeldStreams`` holds long streams open on one router, to see
that its shutdown lets them end.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import openai

from llmgw.testing.procs import wait_for

MESSAGES: list[Any] = [{"role": "user", "content": "Say something."}]


@dataclasses.dataclass
class Tally:
    """One phase's requests: when it began and ended, how many were served (and streamed), every failure."""

    began: float = dataclasses.field(default_factory=time.monotonic)
    ended: float = 0.0
    ok: int = 0
    streamed: int = 0
    #: The longest a served request took (whole answer, or a stream to its end).
    slowest_s: float = 0.0
    #: Of those served, how many per model.
    by_model: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.began


def _client(url: str, timeout_s: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=timeout_s,
                         http_client=httpx.Client(trust_env=False, timeout=timeout_s))


def _finished(choices: Sequence[Any]) -> bool:
    return bool(choices) and bool(choices[0].finish_reason)


class Traffic:
    """Chat completions to each of ``models`` (streamed and not) through ``url``, until the block ends."""

    def __init__(self, url: str, models: Sequence[str], *, extra_body: Mapping[str, Mapping[str, Any]] | None = None,
                 pace_s: float = 0.1, max_tokens: int = 8, timeout_s: float = 60.0) -> None:
        """``extra_body``: per model, fields added to its requests (llama.cpp's ``ignore_eos``)."""
        self._url = url
        self._extra = {m: dict((extra_body or {}).get(m, {})) for m in models}
        self._pace_s, self._max_tokens, self._timeout_s = pace_s, max_tokens, timeout_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._phase = "start"
        self.tallies: dict[str, Tally] = {"start": Tally()}
        #: Requests sent to each URL that have no answer's first line yet, and that have not ended.
        self._waiting: collections.Counter[str] = collections.Counter()
        self._open: collections.Counter[str] = collections.Counter()
        self._threads = [threading.Thread(target=self._run, args=(m, s), daemon=True, name=f"traffic {m} {s}")
                         for m in models for s in (True, False)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self._timeout_s + 10)
        with self._lock:
            self.tallies[self._phase].ended = self.tallies[self._phase].ended or time.monotonic()

    # -- what the test does -------------------------------------------------------------------------------------
    def phase(self, name: str) -> Tally:
        """Count the requests that start from now on in phase ``name`` (ending the current one)."""
        with self._lock:
            now = time.monotonic()
            self.tallies[self._phase].ended = now
            self._phase = name
            self.tallies[name] = Tally(began=now)
            return self.tallies[name]

    @property
    def url(self) -> str:
        return self._url

    def switch(self, url: str, *, timeout: float = 30) -> None:
        """Send new requests to ``url``; return once none sent to the old one waits for its answer's first line."""
        with self._lock:
            old, self._url = self._url, url
        wait_for(lambda: self._waiting[old] == 0, timeout=timeout, what=f"requests to {old} answered")

    def wait_served(self, n: int, *, timeout: float = 60) -> None:
        """Until ``n`` more requests were served (in any phase)."""
        start = self.served
        wait_for(lambda: self.served >= start + n, timeout=timeout, what=f"{n} more requests served")

    def open_on(self, url: str) -> int:
        """How many requests sent to ``url`` have not ended (their answer, or stream, still coming)."""
        with self._lock:
            return self._open[url]

    @property
    def served(self) -> int:
        return sum(t.ok for t in self.tallies.values())

    @property
    def failures(self) -> list[str]:
        return [f"{name}: {f}" for name, t in self.tallies.items() for f in t.failures]

    # -- the clients --------------------------------------------------------------------------------------------
    def _run(self, model: str, stream: bool) -> None:
        clients: dict[str, openai.OpenAI] = {}
        next_at = time.monotonic()
        try:
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                next_at = max(next_at + self._pace_s, time.monotonic())
                with self._lock:
                    url, phase = self._url, self._phase
                    self._waiting[url] += 1
                    self._open[url] += 1
                client = clients.get(url) or clients.setdefault(url, _client(url, self._timeout_s))
                waiting = [True]
                began = time.monotonic()
                try:
                    failure = self._one(client, model, stream, waiting, url)
                except Exception as e:  # every kind of failure is counted, none ends the client
                    failure = f"{type(e).__name__}: {e}"
                finally:
                    if waiting[0]:
                        self._answered(url)
                with self._lock:
                    self._open[url] -= 1
                    tally = self.tallies[phase]
                    if failure is None:
                        tally.ok += 1
                        tally.streamed += stream
                        tally.by_model[model] += 1
                        tally.slowest_s = max(tally.slowest_s, time.monotonic() - began)
                    else:
                        tally.failures.append(f"{model} {'stream' if stream else 'whole'} via {url}: {failure}")
        finally:
            for c in clients.values():
                c.close()

    def _answered(self, url: str) -> None:
        with self._lock:
            self._waiting[url] -= 1

    def _one(self, client: openai.OpenAI, model: str, stream: bool, waiting: list[bool], url: str) -> str | None:
        """One request; None when it was served, else what was wrong with it."""
        kw: dict[str, Any] = {"model": model, "messages": MESSAGES, "max_tokens": self._max_tokens}
        if self._extra[model]:
            kw["extra_body"] = self._extra[model]
        if stream:
            chunks = client.chat.completions.create(stream=True, **kw)
            waiting[0] = False
            self._answered(url)
            finished = False
            with chunks:
                for chunk in chunks:
                    finished = finished or _finished(chunk.choices)
            return None if finished else "the stream ended without its final chunk"
        with client.chat.completions.with_streaming_response.create(**kw) as raw:
            waiting[0] = False
            self._answered(url)
            if raw.status_code != 200:
                return f"HTTP {raw.status_code}"
            out = raw.parse()
        return None if _finished(out.choices) else f"no finished choice: {out!r}"[:300]


class HeldStreams:
    """``n`` streams of ``max_tokens`` each held open on one router at once; each one's outcome kept."""

    def __init__(self, url: str, model: str, *, n: int = 2, max_tokens: int = 400, timeout_s: float = 60) -> None:
        self.url, self.model, self.max_tokens, self.timeout_s = url, model, max_tokens, timeout_s
        self.outcomes: list[str] = []  # "ok" or why not, one per stream once it ended
        self.chunks = [0] * n
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> HeldStreams:
        for t in self._threads:
            t.start()
        return self

    def wait_flowing(self, *, timeout: float = 30) -> None:
        """Until every stream has had a chunk with content (each is under way at the router)."""
        wait_for(lambda: all(c > 1 for c in self.chunks), timeout=timeout, what="every held stream flowing")

    @property
    def open(self) -> int:
        """How many of the streams have not ended yet."""
        return sum(t.is_alive() for t in self._threads)

    def join(self) -> list[str]:
        for t in self._threads:
            t.join(timeout=self.timeout_s + 10)
        return self.outcomes

    def _run(self, i: int) -> None:
        client = _client(self.url, self.timeout_s)
        finished = False
        try:
            chunks = client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=self.max_tokens,
                                                    stream=True)
            with chunks:
                for chunk in chunks:
                    self.chunks[i] += 1
                    finished = finished or _finished(chunk.choices)
            self.outcomes.append("ok" if finished else f"ended without its final chunk after {self.chunks[i]}")
        except Exception as e:  # kept, for the test to show
            self.outcomes.append(f"{type(e).__name__}: {e} after {self.chunks[i]} chunks")
        finally:
            client.close()
