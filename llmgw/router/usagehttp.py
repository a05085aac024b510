"""A standalone router's quota and usage transports: POSTs to the control plane it follows.

``ControlCalls.quota`` and ``ControlCalls.usage`` are the ``QuotaTransport`` and ``UsageTransport``
(``router.quota``, ``router.usagejournal``), ``claim``/``results`` the ``BatchTransport`` (``router.batchrun``), of
a router outside ``llmgw server``: each POSTs the
document (``api.usage``) with the router's credential to the control plane the table watcher
follows now (``current_url``), so a failover moves them with the table. A failure raises: the
journal sends the batch again, the quota client fails closed on empty leases. Inside ``llmgw
server`` the same two callables are the control plane's ``UsageService`` methods, called in process.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from llmgw.api import batches as batchwire
from llmgw.api import usage as wire
from llmgw.router import controltls, tokenizers


class CallFailed(Exception):
    """The control plane answered, but not with the document (the message says the status and why)."""


class ControlCalls:
    """The two transports over one HTTP session; ``start``/``stop`` with the router."""

    def __init__(self, control_url: str | Callable[[], str], *, headers: Mapping[str, str] | None = None,
                 timeout_s: float = 10.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self._control_url = control_url
        self._ssl = ssl_context  # an https:// control plane's pinned CA (``controltls``); None: the system's
        self._headers = dict(headers or {})
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = controltls.session(self._ssl, timeout=aiohttp.ClientTimeout(total=self._timeout_s))

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def quota(self, sync: wire.QuotaSync) -> wire.QuotaAnswer:
        return wire.QuotaAnswer.from_doc(await self._post(wire.QUOTA_PATH, sync.to_doc()))

    async def usage(self, batch: wire.UsageBatch) -> wire.UsageAck:
        return wire.UsageAck.from_doc(await self._post(wire.USAGE_PATH, batch_doc(batch)))

    async def claim(self, claim: batchwire.LineClaim) -> batchwire.ClaimedLines:
        """Batch lines for this router (issue 32: ``router.batchrun``'s transport, with ``results``)."""
        return batchwire.ClaimedLines.from_doc(await self._post(batchwire.CLAIM_PATH, claim.to_doc()))

    async def results(self, doc: batchwire.LineResults) -> batchwire.ResultsAck:
        return batchwire.ResultsAck.from_doc(await self._post(batchwire.RESULTS_PATH, doc.to_doc()))

    async def tokenizer(self, model: str) -> tokenizers.TokenizerFiles:
        """A kv_aware model's tokenizer files (``GET /api/v1/router/tokenizer/{model}``), for ``router.tokenizers``."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        base = self._control_url if isinstance(self._control_url, str) else self._control_url()
        path = "/api/v1/router/tokenizer/" + urllib.parse.quote(model, safe="")
        async with self._session.get(base.rstrip("/") + path, headers=self._headers,
                                     timeout=aiohttp.ClientTimeout(total=max(self._timeout_s, 120.0))) as resp:
            if resp.status != 200:
                raise CallFailed(f"HTTP {resp.status} from {path}: {(await resp.text(errors='replace'))[:300]}")
            if (resp.content_length or 0) > tokenizers.MAX_BYTES * 2:
                raise CallFailed(f"{path}: {resp.content_length} bytes, past what a router takes")
            return tokenizers.TokenizerFiles.from_doc(await resp.json())

    async def _post(self, path: str, doc: dict[str, Any]) -> Any:
        if self._session is None:
            await self.start()
        assert self._session is not None
        base = self._control_url if isinstance(self._control_url, str) else self._control_url()
        async with self._session.post(base.rstrip("/") + path, json=doc, headers=self._headers) as resp:
            if resp.status in (401, 403):
                raise CallFailed(f"HTTP {resp.status} from {path}: the control plane refused this router's "
                                 "credential; give it one with `llmgw router-token create NAME` and "
                                 "`--token-file FILE` (or LLMGW_ROUTER_TOKEN)")
            if resp.status != 200:
                raise CallFailed(f"HTTP {resp.status} from {path}: {(await resp.text(errors='replace'))[:200]}")
            return await resp.json()


_FIELDS = wire.RECORD_FIELDS


def batch_doc(batch: wire.UsageBatch) -> dict[str, Any]:
    """``batch.to_doc()``, at a fraction of its cost: a ``UsageRow`` zipped with the field names, a
    ``UsageRecord``'s fields read one by one, not ``dataclasses.asdict``."""
    row = wire.UsageRow
    return {"router": batch.router_id, "journal": batch.journal,
            "records": [dict(zip(_FIELDS, r, strict=True)) if type(r) is row else {f: getattr(r, f) for f in _FIELDS}
                        for r in batch.records]}
