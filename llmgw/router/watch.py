"""Keeping the route table current: a long poll on the control plane's endpoints document.

``TableWatcher`` asks ``GET {control}/api/v1/endpoints?after=V&timeout=T``; the
control plane answers at once when its version is not ``V`` and otherwise holds
the request up to ``T`` seconds. Each answer becomes a new ``RouteTable`` swapped
into the holder, so a replica that turns Ready takes traffic within one round
trip rather than one polling interval.

When the control plane cannot be reached, or answers with something that is not
a table, the watcher keeps the last table and retries with capped, jittered
backoff: engines are reached directly, so the router keeps serving while the
control plane restarts (and a fleet of routers does not retry in lock step). One
line is logged when an outage starts and one when it ends, not one per retry.

A secure control plane serves the table only to routers with their own credential
(``headers`` carries ``Authorization: Bearer``); a 401 or 403 is logged saying how
to give the router one, and retried like an outage (a token made later is read on
the router's next start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping

import aiohttp

from llmgw.router.auth import ListenGuard
from llmgw.router.table import RouteTable, TableError, TableHolder

log = logging.getLogger(__name__)


class _PollFailed(Exception):
    pass


class TableWatcher:
    """Long-polls ``control_url`` and swaps each new table into ``holder``."""

    def __init__(self, control_url: str, holder: TableHolder, *, session: aiohttp.ClientSession | None = None,
                 poll_timeout_s: float = 30.0, backoff_min_s: float = 0.2, backoff_max_s: float = 5.0,
                 headers: Mapping[str, str] | None = None, listen_guard: ListenGuard | None = None) -> None:
        self._url = control_url.rstrip("/") + "/api/v1/endpoints"
        self._holder = holder
        self._session = session
        self._own_session = session is None
        self._poll_timeout_s = poll_timeout_s
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._headers = dict(headers or {})
        self._guard = listen_guard  # warns when a table leaves a non-loopback listen without keys
        self._after = -1  # no version yet: the first poll answers at once
        self._task: asyncio.Task[None] | None = None
        self._loaded = asyncio.Event()

    async def start(self) -> None:
        if self._task is not None:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._run(), name="llmgw-router-table-watch")

    async def stop(self) -> None:
        """Cancel the poll in flight and return; the holder keeps the last table."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def wait_loaded(self, timeout: float) -> bool:
        """True once a first table has been installed, False if ``timeout`` passes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._loaded.wait(), timeout)
        return self._loaded.is_set()

    async def _run(self) -> None:
        backoff = self._backoff_min_s
        outage_since: float | None = None
        while True:
            try:
                table = RouteTable.from_doc(await self._poll())
            except (aiohttp.ClientError, TimeoutError, ValueError, TableError, _PollFailed) as exc:
                if outage_since is None:
                    outage_since = time.monotonic()
                    current = self._holder.current
                    keeping = (f"serving the last table (v{current.version})" if current.loaded
                               else "no table yet, answering 503 until one arrives")
                    log.warning("cannot read routes from %s: %s; %s, retrying", self._url,
                                exc or type(exc).__name__, keeping)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self._backoff_max_s)
                continue
            if outage_since is not None:
                log.info("routes readable again from %s after %.1fs", self._url, time.monotonic() - outage_since)
                outage_since = None
            backoff = self._backoff_min_s
            unchanged = table.version == self._after
            self._after = table.version
            self._install(table)
            if unchanged:
                # A control plane that answers at once without a change (no long-poll
                # support) would otherwise be asked again in a tight loop.
                await asyncio.sleep(self._backoff_min_s)

    async def _poll(self) -> object:
        assert self._session is not None
        params = {"after": str(self._after), "timeout": f"{self._poll_timeout_s:g}"}
        timeout = aiohttp.ClientTimeout(total=self._poll_timeout_s + 10.0)
        async with self._session.get(self._url, params=params, headers=self._headers, timeout=timeout) as resp:
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:200]
                if resp.status in (401, 403):
                    given = "a router token" if "authorization" in {k.lower() for k in self._headers} else "no token"
                    raise _PollFailed(f"the control plane refused {given} (HTTP {resp.status}: {text}); make one with "
                                      "`llmgw router-token create NAME` and start the router with `--token-file "
                                      "FILE` (or LLMGW_ROUTER_TOKEN)")
                raise _PollFailed(f"HTTP {resp.status}: {text}")
            return await resp.json(content_type=None)

    def _install(self, table: RouteTable) -> None:
        old = self._holder.current
        if table != old:
            self._holder.swap(table)
            log.info("route table v%d: %d models, %d endpoints (was v%d: %d models, %d endpoints)",
                     table.version, len(table.models), table.endpoint_count(),
                     old.version, len(old.models), old.endpoint_count())
        if self._guard is not None:
            self._guard.check(table.auth)
        self._loaded.set()
