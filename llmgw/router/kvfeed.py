"""Filling ``kv_aware``'s view (``kvview.KvView``) from the control plane's relay of the replicas' KV block sets.

``KvFeed`` long-polls ``GET {control}/api/v1/router/kv?after=V&origin=O&timeout=T`` (``api.kvdocs.KvDoc``);
``LocalKvFeed`` calls the relay of the control plane in its own process (``llmgw server``). Each answer is
applied to the view (``apply``): a reset replaces every set, a change adds and removes keys, a replica gone
is dropped. A relay the router cannot reach leaves the view as it was and is asked again with backoff; a
control plane without the relay (before 0.3.0: 404) is asked again every ``ABSENT_RETRY_S``, and
``kv_aware`` falls back to ``prefix_cache`` meanwhile (its view is empty). Costs no request anything: the
policy alone reads the view.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping

import aiohttp

from llmgw.api import kvdocs
from llmgw.api.reports import WireError
from llmgw.core import kvdigest
from llmgw.core.background import Background
from llmgw.router import controltls
from llmgw.router.kvview import KvView, ReplicaCache

log = logging.getLogger(__name__)

PATH = "/api/v1/router/kv"
#: A control plane that has no relay (404) is asked again after this long.
ABSENT_RETRY_S = 60.0


def apply(view: KvView, doc: kvdocs.KvDoc) -> None:
    """Brings ``view`` to ``doc``'s version."""
    if doc.reset:
        for rid in list(view.replicas()):
            view.update(rid, None)
    for c in doc.changes:
        if c.gone or c.hashing is None:
            view.update(c.replica_id, None)
            continue
        cur = view.get(c.replica_id)
        if c.full or cur is None or cur.block_size != c.hashing.block_size:
            h = c.hashing
            view.update(c.replica_id, ReplicaCache(set(c.added), h.block_size, h.algo, h.seed or None,
                                                   int_hashes=True, sample=kvdigest.rate(h.block_size)))
            continue
        blocks = cur.blocks
        assert isinstance(blocks, set)  # the feed's own, made above
        blocks.difference_update(c.removed)
        blocks.update(c.added)


class _Follow:
    """The loop both feeds run: ask, apply, repeat; the view kept through failures."""

    def __init__(self, view: KvView, name: str) -> None:
        self.view = view
        self.version, self.origin = -1, ""
        self.answers = 0
        self._task = Background(name)

    async def start(self) -> None:
        self._task.start(self._run)

    async def stop(self) -> None:
        await self._task.stop()

    async def _ask(self) -> kvdocs.KvDoc:
        raise NotImplementedError

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                doc = await self._ask()
            except _Absent:
                self.version, self.origin = -1, ""
                await asyncio.sleep(ABSENT_RETRY_S)
                continue
            except Exception as exc:  # an outage or a bad document: keep the view, ask again later
                log.debug("KV block sets not read (%s); retrying", str(exc) or type(exc).__name__)
                self.version, self.origin = -1, ""
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.2
            apply(self.view, doc)
            self.answers += 1
            self.version, self.origin = doc.version, doc.origin


class _Absent(Exception):
    pass


class KvFeed(_Follow):
    """Long-polls the relay of the control plane ``url()`` names (the one the table watcher follows now)."""

    def __init__(self, view: KvView, url: Callable[[], str], *, headers: Mapping[str, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None, poll_timeout_s: float = 25.0) -> None:
        super().__init__(view, "llmgw-router-kv-feed")
        self._url, self._headers, self._ssl = url, dict(headers or {}), ssl_context
        self._poll_timeout_s = poll_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = controltls.session(self._ssl)
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _ask(self) -> kvdocs.KvDoc:
        assert self._session is not None
        params = {"after": str(self.version), "origin": self.origin, "timeout": f"{self._poll_timeout_s:g}"}
        timeout = aiohttp.ClientTimeout(total=self._poll_timeout_s + 10.0)
        async with self._session.get(self._url().rstrip("/") + PATH, params=params, headers=self._headers,
                                     timeout=timeout) as resp:
            if resp.status == 404:
                raise _Absent()
            if resp.status != 200:
                raise WireError(f"HTTP {resp.status}")
            return kvdocs.KvDoc.from_doc(await resp.json(content_type=None))


class LocalKvFeed(_Follow):
    """Follows the relay of the control plane in this process: ``wait(after=, origin=, timeout=)`` is its long poll."""

    def __init__(self, view: KvView, wait: Callable[..., Awaitable[kvdocs.KvDoc]], *,
                 poll_timeout_s: float = 25.0) -> None:
        super().__init__(view, "llmgw-router-kv-local")
        self._wait, self._poll_timeout_s = wait, poll_timeout_s

    async def _ask(self) -> kvdocs.KvDoc:
        return await self._wait(after=self.version, origin=self.origin, timeout=self._poll_timeout_s)
