"""Per-key requests-per-minute and tokens-per-minute, over a sliding 60-second window.

Each key keeps the times of its admitted requests and the token counts recorded
for them, dropping what is older than the window on every look, so a limit is
exact (no bucket-edge bursts of twice the limit) and memory stays bounded by the
limit itself. Tokens are known only after a request (the engine's ``usage``), so
the tpm limit refuses a request once the window's tokens are already spent; the
request that crosses the line is let through, and the next ones wait.

A refusal is a ``Throttled`` (429) with ``retry_after_s``, the whole seconds until
the window has room again; send it as the ``Retry-After`` header. Pure: the clock
is injected, nothing here sleeps or opens a socket.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from llmgw.router import errors
from llmgw.router.auth import KeyInfo

WINDOW_S = 60.0


class Throttled(errors.ApiError):
    """429 with the seconds a client should wait; ``headers()`` carries them as ``Retry-After``."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(429, message, type="rate_limit_exceeded", code="rate_limit_exceeded")
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())]


@dataclasses.dataclass(slots=True)
class _Window:
    requests: collections.deque[float] = dataclasses.field(default_factory=collections.deque)
    tokens: collections.deque[tuple[float, int]] = dataclasses.field(default_factory=collections.deque)
    spent: int = 0


class RateLimiter:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S) -> None:
        self._clock, self._window_s = clock, window_s
        self._keys: dict[str, _Window] = {}

    def admit(self, key: KeyInfo) -> Throttled | None:
        """Counts a request for ``key`` and returns None, or returns the refusal (and counts nothing)."""
        if not key.rpm and not key.tpm:
            return None
        now = self._clock()
        w = self._prune(key.id, now)
        if key.rpm and len(w.requests) >= key.rpm:
            wait = w.requests[len(w.requests) - key.rpm] + self._window_s - now
            return Throttled(f"The API key {key.id} made {len(w.requests)} requests in the last minute; its limit "
                             f"is {key.rpm} a minute. Retry in {_secs(wait)}s.", retry_after_s=_secs(wait))
        if key.tpm and w.spent >= key.tpm:
            wait, left = 0.0, w.spent
            for ts, n in w.tokens:  # oldest first: the time the window's tokens fall below the limit
                left -= n
                wait = ts + self._window_s - now
                if left < key.tpm:
                    break
            return Throttled(f"The API key {key.id} used {w.spent} tokens in the last minute; its limit is "
                             f"{key.tpm} a minute. Retry in {_secs(wait)}s.", retry_after_s=_secs(wait))
        if key.rpm:
            w.requests.append(now)
        return None

    def record_tokens(self, key_id: str, n: int) -> None:
        """Counts ``n`` tokens (prompt + completion, from the engine's ``usage``) against ``key_id``."""
        if n <= 0 or not key_id:
            return
        now = self._clock()
        w = self._prune(key_id, now)
        w.tokens.append((now, n))
        w.spent += n

    def spent(self, key_id: str) -> tuple[int, int]:
        """Requests and tokens counted in the current window, for metrics and tests."""
        w = self._prune(key_id, self._clock())
        return len(w.requests), w.spent

    def forget(self, keep: Iterable[str]) -> None:
        """Drops the windows of keys not in ``keep`` (deleted keys), so they do not stay forever."""
        kept = set(keep)
        for key_id in [k for k in self._keys if k not in kept]:
            del self._keys[key_id]

    def _prune(self, key_id: str, now: float) -> _Window:
        w = self._keys.setdefault(key_id, _Window())
        edge = now - self._window_s
        while w.requests and w.requests[0] <= edge:
            w.requests.popleft()
        while w.tokens and w.tokens[0][0] <= edge:
            w.spent -= w.tokens.popleft()[1]
        return w


def usage_tokens(doc: Any) -> int:
    """Tokens an engine's answer (or a stream chunk) reports in ``usage``; 0 when it reports none."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and total > 0:
        return total
    parts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
    return sum(n for n in parts if isinstance(n, int) and n > 0)


class StreamUsage:
    """Finds ``usage`` in an SSE stream as it is relayed, chunk by chunk, without holding it back.

    Only the tail after the last newline is kept between chunks, so an event split
    across two reads is still seen and memory stays at one line.
    """

    def __init__(self) -> None:
        self.tokens = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            self._line(line)

    def close(self) -> int:
        """Reads what is left and returns the tokens found (the last ``usage`` seen wins)."""
        self._line(self._tail)
        self._tail = b""
        return self.tokens

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return
        try:
            n = usage_tokens(json.loads(line[5:]))
        except ValueError:
            return  # not JSON ("[DONE]") or cut: nothing to count
        if n:
            self.tokens = n


def _secs(wait: float) -> int:
    # At least 1: "Retry-After: 0" makes well-behaved clients retry at once, into the same refusal.
    return max(1, math.ceil(wait))
