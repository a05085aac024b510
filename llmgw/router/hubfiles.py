"""A router hub's workers' ``/v1/files`` and ``/v1/batches``, passed on to the control plane followed now (issue 32).

A standalone router passes these to its control plane itself (``controlpass``); a hub's worker follows the hub, so
it passes them to the hub, which sends them on as they came: the client's ``Authorization`` (its API key is what
the control plane checks, never the hub's router credential) and the headers ``controlpass.PASSED`` names, the
body streamed. The hub's API is its workers' only: here a worker proves itself with the hub's secret in
``WORKER_HEADER`` (``Authorization`` being the client's), which is never sent on.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

import aiohttp
import yarl
from aiohttp import web

from llmgw.router import controltls
from llmgw.router.controlpass import PASSED, RETURNED
from llmgw.router.hubledger import error as _error

log = logging.getLogger(__name__)
#: The header a worker's passed request carries the hub's secret in.
WORKER_HEADER = "X-Llmgw-Hub-Worker"
PREFIXES = ("/v1/files", "/v1/batches")


def serves(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PREFIXES)


class FilesPass:
    def __init__(self, control_url: Callable[[], str], *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._control_url, self._ssl = control_url, ssl_context
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = controltls.session(self._ssl, timeout=aiohttp.ClientTimeout(total=600, connect=5),
                                               auto_decompress=False)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def add_routes(self, made: web.Application) -> None:
        for prefix in PREFIXES:
            made.router.add_route("*", prefix, self.handle)
            made.router.add_route("*", prefix + "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        await self.start()
        assert self._session is not None
        target = self._control_url().rstrip("/") + request.raw_path
        headers = {k: v for k, v in request.headers.items() if k.lower().encode() in PASSED}
        try:
            async with self._session.request(request.method, yarl.URL(target, encoded=True), headers=headers,
                                             data=request.content if request.body_exists else None,
                                             allow_redirects=False,
                                             skip_auto_headers=("Content-Type", "Accept-Encoding")) as resp:
                extra = {k.decode("latin-1"): v.decode("latin-1") for k, v in resp.raw_headers
                         if k.lower() in RETURNED and k.lower() != b"content-type"}
                return web.Response(status=resp.status, body=await resp.read(), headers=extra,
                                    content_type=resp.content_type or "application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("the control plane did not answer %s %s: %s", request.method, request.path,
                        str(exc) or type(exc).__name__)
            return _error(502, "the router's hub could not reach its control plane, which serves files and batches; "
                               "retry")
