"""A router hub's workers' ``/v1/files`` and ``/v1/batches``, passed on to the control plane followed now (issue 32).

A standalone router passes these to its control plane itself (``controlpass``); a hub's worker follows the hub, so
it passes them to the hub, which sends them on as they came: the client's ``Authorization`` (its API key is what
the control plane checks, never the hub's router credential) and the headers ``controlpass.PASSED`` names, the
body streamed. The hub's API is its workers' only: here a worker proves itself with the hub's secret in
``WORKER_HEADER`` (``Authorization`` being the client's), which is never sent on.
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmgw.api import batches as batchwire
from llmgw.router import controlpass
from llmgw.router.hubledger import error as _error

log = logging.getLogger(__name__)
#: The header a worker's passed request carries the hub's secret in.
WORKER_HEADER = "X-Llmgw-Hub-Worker"


class FilesPass(controlpass.ControlPass):
    """``controlpass``'s forwarding, answering the hub's aiohttp routes."""

    def add_routes(self, made: web.Application) -> None:
        for prefix in batchwire.OPENAI_PREFIXES:
            made.router.add_route("*", prefix, self.handle)
            made.router.add_route("*", prefix + "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower().encode() in controlpass.PASSED}
        try:
            status, body, extra, content_type = await self.forward(
                request.method, request.raw_path, headers, request.content if request.body_exists else None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("the control plane did not answer %s %s: %s", request.method, request.path,
                        str(exc) or type(exc).__name__)
            return _error(502, "the router's hub could not reach its control plane, which serves files and batches; "
                               "retry")
        kept = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in extra]
        return web.Response(status=status, body=body, headers=CIMultiDict([("Content-Type", content_type), *kept]))
