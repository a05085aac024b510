"""Steady client load through the router for tests: completions back to back, every failure kept.

Half the clients stream, half do not; a stream counts as served only when it
ends with ``[DONE]`` and carries no error event, so an engine stopped under a
stream is a failure here even though its status line was 200. Each failure is
also kept by whether any byte of an answer had come: a router can re-send a
request that had none, never one whose stream had begun.
"""

from __future__ import annotations

import json
import ssl
import threading
import time

import httpx

from llmgw.testing.procs import wait_for


class Load:
    """Clients sending completions through the router back to back until stopped; every failure kept."""

    def __init__(self, url: str, model: str, *, clients: int = 4, timeout_s: float = 30,
                 verify: ssl.SSLContext | bool = True, pace_s: float = 0.0, fresh_connections: bool = False) -> None:
        """``timeout_s`` is each client's: a patient client (60 s) waits out a hung engine's re-send. ``verify``: an
        https URL's trust (a context with the CA). ``pace_s``: each client starts a request at most this often
        (0: back to back). ``fresh_connections``: a new connection (a TLS handshake) for every request."""
        self._verify = verify
        self._pace_s = pace_s
        self._fresh = fresh_connections
        self.url, self.model = url, model
        self.ok = 0  # requests served, both kinds
        self.streamed = 0  # of those, streams
        self.failures: list[str] = []  # every failure, "stream: ..." or "whole: ..."
        self.before_bytes: list[str] = []  # failed with no byte of an answer received
        self.after_bytes: list[str] = []  # a stream cut after bytes had come
        self.slowest_s = 0.0  # the longest a request that was served took
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i % 2 == 0,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self._timeout_s + 10)

    def _count(self, stream: bool, failure: str | None, *, got_bytes: bool, took_s: float = 0.0) -> None:
        with self._lock:
            if failure is None:
                self.ok += 1
                self.streamed += stream
                self.slowest_s = max(self.slowest_s, took_s)
                return
            failure = f"{'stream' if stream else 'whole'}: {failure}"
            self.failures.append(failure)
            (self.after_bytes if got_bytes else self.before_bytes).append(failure)

    def _run(self, stream: bool) -> None:
        body = {"model": self.model, "prompt": "x", "max_tokens": 8, "stream": stream}
        limits = httpx.Limits(max_keepalive_connections=0) if self._fresh else httpx.Limits()
        with httpx.Client(timeout=self._timeout_s, trust_env=False, verify=self._verify, limits=limits) as c:
            next_at = time.monotonic()
            while not self._stop.is_set():
                if self._pace_s:   # steady: one request every pace_s per client, whatever each took
                    if self._stop.wait(max(0.0, next_at - time.monotonic())):
                        break
                    next_at = max(next_at + self._pace_s, time.monotonic() - self._pace_s)
                got = b""
                started = time.monotonic()
                try:
                    # Read raw for both kinds, so a failure knows whether any byte had come.
                    with c.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                        for chunk in r.iter_raw():
                            got += chunk
                    text = got.decode("utf-8", "replace")
                    if r.status_code != 200:
                        failure: str | None = f"HTTP {r.status_code}: {text[:200]}"
                    elif stream:
                        lines = [x for x in text.splitlines() if x]
                        done = bool(lines) and lines[-1] == "data: [DONE]" and not any('"error"' in x for x in lines)
                        failure = None if done else f"stream cut: {lines[-2:]}"
                    else:
                        failure = None if _has_text(text) else f"no text: {text[:200]}"
                    # A status that is not 200 is an answer of no use: counted as no byte served.
                    self._count(stream, failure, got_bytes=r.status_code == 200 and bool(got),
                                took_s=time.monotonic() - started)
                except httpx.HTTPError as e:
                    self._count(stream, repr(e), got_bytes=bool(got))

    def wait_ok(self, n: int, *, timeout: float = 30) -> None:
        start = self.ok
        wait_for(lambda: self.ok >= start + n, timeout=timeout, what=f"{n} more requests served")


def _has_text(body: str) -> bool:
    """A completion whose first choice has some text; a body that is not one (cut JSON, an error) has none."""
    try:
        return bool(json.loads(body)["choices"][0]["text"])
    except (ValueError, KeyError, IndexError, TypeError):
        return False
