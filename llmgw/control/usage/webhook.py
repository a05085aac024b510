"""The budget webhook: each threshold crossing POSTed as JSON to the configured URL, signed, retried.

``X-Llmgw-Signature: sha256=<hex>`` is the HMAC-SHA256 of the exact body with the shared secret, so the
receiver knows the control plane sent it and nothing changed it on the way. Deliveries run in a
background task out of a bounded queue: a quota sync never waits on a receiver, and a receiver that is
down for long costs at most ``QUEUE_MAX`` bodies of memory (the oldest news is kept, newer dropped and
counted). A delivery answered 5xx or 429, or not answered, is retried with backoff; another 4xx is the
receiver refusing it, not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Llmgw-Signature"
QUEUE_MAX = 1000
#: Seconds between tries: a receiver down for about 2 minutes still gets every crossing.
BACKOFF_S: tuple[float, ...] = (0.5, 1, 2, 4, 8, 16, 30, 60)


def signature(secret: bytes, body: bytes) -> str:
    """The header's value for ``body``: ``sha256=`` and the hex HMAC-SHA256 with ``secret``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class Webhook:
    """Delivers documents to one URL in the background; ``post`` never waits."""

    def __init__(self, url: str, secret: bytes = b"", *, backoff_s: Sequence[float] = BACKOFF_S,
                 timeout_s: float = 5.0) -> None:
        self.url = url
        self._secret = secret
        self._backoff = tuple(backoff_s)
        self._timeout = timeout_s
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_MAX)
        self._task: asyncio.Task[None] | None = None
        #: Bodies delivered, given up on, and dropped because the queue was full.
        self.delivered = self.failed = self.dropped = 0

    def post(self, doc: Mapping[str, Any]) -> None:
        """Queues ``doc`` for delivery (started on first use, on the running loop); dropped when the queue is full."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="llmgw-budget-webhook")
        body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        try:
            self._queue.put_nowait(body)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("budget webhook %s: %d deliveries queued, this one dropped: is the receiver up?",
                        self.url, QUEUE_MAX)

    async def drain(self) -> None:
        """Returns once every queued body was delivered or given up (tests, a clean stop)."""
        await self._queue.join()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            while True:
                body = await self._queue.get()
                try:
                    await self._deliver(client, body)
                finally:
                    self._queue.task_done()

    async def _deliver(self, client: httpx.AsyncClient, body: bytes) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "llmgw-budget-webhook"}
        if self._secret:
            headers[SIGNATURE_HEADER] = signature(self._secret, body)
        why = ""
        for wait in (*self._backoff, None):
            try:
                answer = await client.post(self.url, content=body, headers=headers)
                if answer.status_code < 300:
                    self.delivered += 1
                    return
                why = f"answered {answer.status_code}"
                if answer.status_code < 500 and answer.status_code != 429:
                    break  # the receiver refuses this body: trying again changes nothing
            except httpx.HTTPError as e:
                why = f"{type(e).__name__}: {e}"
            if wait is None:
                break
            await asyncio.sleep(wait)
        self.failed += 1
        log.warning("budget webhook %s: a crossing not delivered (%s); the event and audit log have it", self.url, why)
