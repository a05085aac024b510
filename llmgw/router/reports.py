"""Telling the control plane what this router saw: replicas ejected, replicas answering again, keys used.

The control plane marks a replica Ready from its own health checks; the router
sees what real requests meet between two checks (``health``). Without a report,
``llmgw get replicas`` would show a replica Ready while every router had taken it
out of rotation for a minute, and an operator would look in the wrong place.

Each event is one of ``llmgw.api.routing``'s (``Ejected``, ``Recovered``, ``KeyUsed``), sent in a
``RouterReport``: its ``to_doc()`` is the body ``POST /api/v1/router/events`` takes
(``llmgw.api.reports`` shows it). ``KeyUsed`` carries the newest time the key was let in
here, at most once every few seconds per key (``keyuse``): the control plane keeps it as
the key's "last used".

The router and the control plane never import each other: inside ``llmgw
server`` each report goes, as the object, to a callback ``serve`` wires to the
control plane's recorder (``CallbackSink``); a standalone router POSTs them (``HttpSink``).

Reporting never delays a request: ``ejected``/``recovered`` only append to a
list, and ``HttpSink`` sends from its own task, in batches, with a bounded
backlog (oldest dropped) and capped backoff while the control plane is down.
A recovery is reported only for a replica whose ejection was, so the common
case (a success on a replica that never failed) costs nothing here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from llmgw.api.routing import Ejected, KeyUsed, Recovered, RouterEvent, RouterReport
from llmgw.core.background import Background
from llmgw.router import controltls, keyuse

log = logging.getLogger(__name__)

EVENTS_PATH = "/api/v1/router/events"


class Sink:
    """Collects the events; subclasses deliver them. Alone, it only keeps which replicas it ejected."""

    def __init__(self, router_id: str, *, clock: Callable[[], float] = time.time,
                 key_use_every_s: float = keyuse.EVERY_S) -> None:
        self.router_id = router_id
        self._clock = clock
        self._ejected: set[str] = set()
        self._key_uses = keyuse.KeyUse(self._report_key_use, every_s=key_use_every_s, clock=clock)

    def ejected(self, model: str, replica_id: str, *, for_s: float, failures: int, reason: str) -> None:
        self._ejected.add(replica_id)
        self.deliver(Ejected(model=model, replica=replica_id, for_s=round(for_s, 3), failures=failures,
                             reason=reason, at=self._clock()))

    def recovered(self, model: str, replica_id: str) -> None:
        if replica_id not in self._ejected:
            return  # a streak that never ejected: nothing was reported, nothing to take back
        self._ejected.discard(replica_id)
        self.deliver(Recovered(model=model, replica=replica_id, at=self._clock()))

    def key_used(self, key_id: str) -> None:
        """A request with the key ``key_id`` was let in; reported as ``key_used`` at most every few seconds."""
        self._key_uses.used(key_id)

    def _report_key_use(self, key_id: str, at: float) -> None:
        self.deliver(KeyUsed(key=key_id, at=at))

    def deliver(self, event: RouterEvent) -> None:
        """Hand one event on; must not block or raise."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self._key_uses.flush()


class CallbackSink(Sink):
    """In-process: each event goes to ``callback(RouterReport(router_id, (event,)))`` at once, as the object."""

    def __init__(self, router_id: str, callback: Callable[[RouterReport], object], **kw: Any) -> None:
        super().__init__(router_id, **kw)
        self._callback = callback

    def deliver(self, event: RouterEvent) -> None:
        try:
            self._callback(RouterReport(self.router_id, (event,)))
        except Exception:  # a bug on the other side must not fail the request that saw the ejection
            log.exception("recording a router event failed")


class HttpSink(Sink):
    """A standalone router's: POSTs batches of events to the control plane from one background task.

    ``control_url`` is a base URL, or a callable giving the one to use now: with several control
    planes, the table watcher's ``current_url``, so reports go to one that answers rather than keep
    retrying, for as long as it is down, the one the router was started with.
    """

    def __init__(self, router_id: str, control_url: str | Callable[[], str], *, max_backlog: int = 1000,
                 backoff_max_s: float = 10.0, headers: Mapping[str, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None, **kw: Any) -> None:
        super().__init__(router_id, **kw)
        self._control_url = control_url
        self._ssl = ssl_context  # an https:// control plane's pinned CA (``controltls``); None: the system's
        self._backlog: collections.deque[RouterEvent] = collections.deque(maxlen=max_backlog)
        self._wake = asyncio.Event()
        self._backoff_max_s = backoff_max_s
        self._headers = dict(headers or {})
        self._task = Background("llmgw-router-events")
        self._session: aiohttp.ClientSession | None = None
        #: Events the control plane acknowledged, for tests and the log.
        self.sent = 0

    @property
    def url(self) -> str:
        """Where the next batch goes: read before each attempt, so a retry follows the watcher's switch."""
        base = self._control_url if isinstance(self._control_url, str) else self._control_url()
        return base.rstrip("/") + EVENTS_PATH

    def deliver(self, event: RouterEvent) -> None:
        if len(self._backlog) == self._backlog.maxlen:
            log.warning("control plane unreachable: dropping the oldest router event (backlog of %d)",
                        self._backlog.maxlen)
        self._backlog.append(event)
        self._wake.set()

    async def start(self) -> None:
        if self._session is None:  # started once until stopped
            self._session = controltls.session(self._ssl, timeout=aiohttp.ClientTimeout(total=10))
            self._task.start(self._run)

    async def stop(self) -> None:
        """One last try to send what is pending (at most a second), then stop."""
        self._key_uses.flush()  # into the backlog, so the last uses go with the last batch
        await self._task.stop()
        if self._session is not None:
            if self._backlog:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send_batch(self.url), 1.0)
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        backoff = 0.2
        failing = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._backlog:
                url = self.url  # the one tried, for the log: the watcher may switch while this one is awaited
                try:
                    await self._send_batch(url)
                except (aiohttp.ClientError, TimeoutError, _Refused) as exc:
                    if not failing:
                        failing = True
                        log.warning("cannot report %d router events to %s: %s; retrying", len(self._backlog),
                                    url, str(exc) or type(exc).__name__)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._backoff_max_s)
                    continue
                if failing:
                    failing = False
                    log.info("router events reach %s again", url)
                backoff = 0.2

    async def _send_batch(self, url: str) -> None:
        assert self._session is not None
        batch = list(self._backlog)
        async with self._session.post(url, json=RouterReport(self.router_id, tuple(batch)).to_doc(),
                                      headers=self._headers) as resp:
            if resp.status >= 500:
                raise _Refused(f"HTTP {resp.status}")
            if resp.status in (401, 403):
                # Kept and retried, not dropped: the credential is what is wrong, not the events.
                raise _Refused(f"HTTP {resp.status}: the control plane refused this router's credential; give it "
                               "one with `llmgw router-token create NAME` and `--token-file FILE` "
                               "(or LLMGW_ROUTER_TOKEN)")
            if resp.status >= 400:
                # A control plane that does not know the endpoint (older) or refuses the
                # batch: retrying the same bytes cannot help, so they are dropped, said once.
                log.warning("control plane refused %d router events: HTTP %d %s", len(batch), resp.status,
                            (await resp.text(errors="replace"))[:200])
        for _ in batch:
            self._backlog.popleft()
        self.sent += len(batch)


class _Refused(Exception):
    pass
