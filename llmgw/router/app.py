"""The router's ASGI app: the OpenAI API, each request forwarded straight to a ready engine.

``RouterApp`` answers ``GET /v1/models`` from the route table and forwards
``POST /v1/chat/completions`` and ``/v1/completions`` to one of the model's
endpoints (``upstream`` picks and retries). Everything the router says itself is
an OpenAI-shaped error from ``errors``; what an engine says is relayed as it is.

A stream is relayed chunk by chunk as each arrives, with nothing buffered. While
relaying, a second task watches ``receive()`` for the client's disconnect and
then cancels the relay, which closes the upstream connection: without it the
engine would keep generating for a client that left, holding a slot that queued
requests are waiting for.

The app owns its HTTP client pools: ``startup()`` and ``shutdown()``, or ASGI
lifespan when it runs alone. A ``watcher`` passed in is started and stopped with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Protocol

from llmgw.router import asgi, errors, pick, relay, request, upstream
from llmgw.router.table import ModelRoute, RouteTable, TableHolder

log = logging.getLogger(__name__)

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
MODELS_PATH = "/v1/models"


class Lifecycle(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class RouterApp:
    """A raw ASGI app serving the OpenAI API from the routes in ``holder``."""

    def __init__(self, holder: TableHolder, *, watcher: Lifecycle | None = None,
                 source: str = "the control plane", connect_timeout_s: float = 5.0,
                 max_endpoints: int = 3, max_body_bytes: int = 32 << 20) -> None:
        self.holder = holder
        self._watcher = watcher
        self._source = source  # named in the 503 answered before the first table arrives
        self._max_body = max_body_bytes
        self._forwarder = upstream.Forwarder(pick.RoundRobin(), connect_timeout_s=connect_timeout_s,
                                             max_endpoints=max_endpoints)
        self._models_cache: tuple[RouteTable, bytes] | None = None

    async def startup(self) -> None:
        await self._forwarder.start()
        if self._watcher is not None:
            await self._watcher.start()

    async def shutdown(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
        await self._forwarder.close()

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        path, method = scope["path"], scope["method"]
        try:
            if path in COMPLETION_PATHS:
                if method != "POST":
                    raise errors.method_not_allowed(method, path, "POST")
                await self._complete(path, receive, send)
            elif path == MODELS_PATH:
                if method not in ("GET", "HEAD"):
                    raise errors.method_not_allowed(method, path, "GET")
                await asgi.send_bytes(send, 200, self._models_body())
            else:
                raise errors.path_not_found(method, path)
        except errors.ApiError as exc:  # raised only before the response started
            await asgi.send_error(send, exc)
        except asgi.ClientGone:
            pass

    def _models_body(self) -> bytes:
        table = self.holder.current
        if self._models_cache is None or self._models_cache[0] is not table:
            data = [{"id": name, "object": "model", "created": model.created, "owned_by": "llmgw"}
                    for model in table.models for name in model.public_names()]
            self._models_cache = (table, json.dumps({"object": "list", "data": data}).encode())
        return self._models_cache[1]

    async def _complete(self, path: str, receive: asgi.Receive, send: asgi.Send) -> None:
        req = request.parse(await asgi.read_body(receive, limit=self._max_body))
        table = self.holder.current  # one snapshot for the whole request
        if not table.loaded:
            raise errors.table_not_loaded(self._source)
        route = table.lookup(req.model)
        if route is None:
            raise errors.model_not_found(req.model, table.public_names())
        if not route.endpoints:
            raise errors.no_ready_endpoint(req.model, route.state, route.message)
        body = request.for_engine(req, route.served_name)
        forward = asyncio.ensure_future(self._forward(route, path, body, send))
        watch = asyncio.ensure_future(asgi.wait_disconnect(receive))
        try:
            await asyncio.wait((forward, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Whichever finished first, the other must not outlive the request; this also
            # runs when the server cancels this handler at shutdown.
            watch.cancel()
            if not forward.done():
                forward.cancel()
                log.info("client left during a %s request for %r; upstream request cancelled",
                         path, req.model)
            await asyncio.gather(forward, watch, return_exceptions=True)
        if not forward.cancelled():
            forward.result()  # re-raise what went wrong in the relay, if anything did

    async def _forward(self, route: ModelRoute, path: str, body: bytes, send: asgi.Send) -> None:
        try:
            endpoint, response = await self._forwarder.open(route, path, body)
        except errors.ApiError as exc:
            log.warning("%s", exc.message)
            await asgi.send_error(send, exc)
            return
        try:
            if response.headers.get("Content-Type", "").startswith("text/event-stream"):
                await relay.stream(endpoint, response, send)
            else:
                await relay.whole(route, endpoint, response, send)
        finally:
            # After a complete read the connection is already back in the pool and this
            # is a no-op; on cancel or error it drops the connection, which is what
            # tells the engine to stop generating.
            response.close()

    async def _lifespan(self, receive: asgi.Receive, send: asgi.Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # reported to the server, which refuses to start
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
