"""A router worker's metrics, pushed to its hub, and its ``/metrics`` answered with every worker's sum.

A worker (of ``llmgw router --workers N`` or ``llmgw server --router-workers N``) POSTs ``metrics.render()``'s
text to its hub's ``metricsmerge.PUSH_PATH?router=ID`` every ``metricsmerge.PUSH_INTERVAL_S`` and once more at
its stop (after its requests drained: the router's ``shutdown``), with the credential and to the URL of its other
hub calls (the table watcher's ``current_url``). Its ``GET /metrics`` (``scrape``) answers with the hub's sum of
every worker (``metricsmerge.MERGED_PATH``), so a scrape through the shared port reads the same series whichever
worker accepted it; when the hub does not answer, with its own, under a comment saying they are one worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import aiohttp

from llmgw.router import metrics, metricsmerge

log = logging.getLogger("llmgw.router.metricspush")


class MetricsPush:
    """The pushes of worker ``router_id`` to the hub at ``hub_url()``; a ``Lifecycle`` (``start``/``stop``)."""

    def __init__(self, router_id: str, hub_url: Callable[[], str], *, headers: Mapping[str, str],
                 interval_s: float = metricsmerge.PUSH_INTERVAL_S, timeout_s: float = 5.0) -> None:
        self._router_id = router_id
        self._hub_url = hub_url
        self._headers = dict(headers)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
        self._task = asyncio.create_task(self._every())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self.push()  # the last counts, after the drain
            await self._session.close()
            self._session = None

    async def _every(self) -> None:
        while True:
            await self.push()
            await asyncio.sleep(self._interval_s)

    async def push(self) -> bool:
        """This worker's metrics to the hub now; False when it did not take them (logged at debug)."""
        if self._session is None:
            return False
        body, content_type = metrics.render()
        url = self._hub_url().rstrip("/") + metricsmerge.PUSH_PATH
        try:
            async with self._session.post(url, params={"router": self._router_id}, data=body,
                                          headers={**self._headers, "Content-Type": content_type}) as resp:
                if resp.status == 200:
                    return True
                log.debug("the hub refused this worker's metrics: HTTP %d", resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("the hub did not take this worker's metrics: %s", str(exc) or type(exc).__name__)
        return False

    async def scrape(self) -> tuple[bytes, str]:
        """Every worker's metrics summed (the hub's); this worker's own, said so, when the hub does not answer."""
        if self._session is not None:
            url = self._hub_url().rstrip("/") + metricsmerge.MERGED_PATH
            try:
                async with self._session.get(url, headers=self._headers) as resp:
                    if resp.status == 200:
                        return await resp.read(), metrics.render()[1]
                    log.warning("the hub answered HTTP %d for the merged metrics", resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("the hub did not answer for the merged metrics: %s", str(exc) or type(exc).__name__)
        body, content_type = metrics.render()
        note = (f"# The hub did not answer: these are one worker's ({self._router_id}) metrics only, "
                "not the sum of the router's workers.\n").encode()
        return note + body, content_type
