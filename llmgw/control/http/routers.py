"""What routers read and report: the endpoints table (``GET /api/v1/endpoints``, long-polled), their
ejections and recoveries of replicas (``/api/v1/router/events``) and their load per model
(``/api/v1/router/signals``, the autoscaler's input). Only a router's credential reaches these. Which routers
report now, and their versions (``GET /api/v1/router/versions``), is for users.

A router's credentials themselves (``/api/v1/routers``) are ``routercreds``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Query, Request, Response

from llmgw.api import tunnel
from llmgw.control import loadreports
from llmgw.control.cluster import Cluster
from llmgw.control.http import paging, schemas
from llmgw.control.http.apierrors import Conflict, Unprocessable, read_json
from llmgw.control.routerreports import BadReport, RouterEvents
from llmgw.core import skew
from llmgw.core.version import version

MAX_BODY = 1 << 20
LONG_POLL_MAX_S = 60.0


def router(cluster: Cluster, reports: RouterEvents, *, protocol: int = skew.PROTOCOL,
           server_version: str | None = None) -> APIRouter:
    """``protocol``/``server_version``: what this control plane says it is to routers, and checks them against
    (``core.skew``): this release's (tests act as another)."""
    api = APIRouter()
    said = skew.headers(protocol, version() if server_version is None else server_version)

    @api.get("/api/v1/endpoints", response_model=schemas.RouterTable, response_model_exclude_unset=True,
             responses={409: {"description": "The router is outside the control plane's skew policy "
                                             f"(``{skew.PROTOCOL_HEADER}``): the sentence names both versions"}})
    async def endpoints(request: Request, response: Response,
                        after: int | None = Query(default=None, ge=-1, le=paging.MAX_ID),
                        timeout: float = Query(default=25.0, ge=0, le=LONG_POLL_MAX_S)) -> dict[str, Any]:
        """The routers' table; with ``after`` its current version, answered when it changes (or at ``timeout``).

        The router says its wire protocol and llmgw version in ``X-Llmgw-Protocol`` and ``X-Llmgw-Version`` (none:
        a router before 0.2.0, protocol 1); one outside the skew policy is refused with 409. Every answer says the
        control plane's in the same headers, which the router checks in turn."""
        refusal = skew.peer_refusal("router", skew.parse_header(request.headers.get(skew.PROTOCOL_HEADER)),
                                    request.headers.get(skew.VERSION_HEADER, "")[:64], server_protocol=protocol,
                                    server_version=said.get(skew.VERSION_HEADER, ""))
        if refusal:
            raise Conflict(refusal, code=skew.REFUSAL_CODE, headers=said)
        response.headers.update(said)
        if cluster.tunnel_port:  # issue 33: where a standalone router reaches tunnelled engines
            response.headers[tunnel.PORT_HEADER] = str(cluster.tunnel_port)
        return (await cluster.wait_table(after=after, timeout=timeout)).to_doc()

    @api.get("/api/v1/router/kv", response_model=schemas.RouterKv)
    async def router_kv(after: int = Query(default=-1, ge=-1, le=paging.MAX_ID),
                        origin: str = Query(default="", max_length=64),
                        timeout: float = Query(default=25.0, ge=0, le=LONG_POLL_MAX_S)) -> Response:
        """What each replica's engine holds in its KV cache, as its agent reports it (routing ``kv_aware``),
        long-polled: answered when something changed after version ``after`` of relay ``origin`` (or at ``timeout``)."""
        body = await cluster.kv.wait_json(after=after, origin=origin, timeout=timeout)
        return Response(content=body, media_type="application/json")

    @api.get("/api/v1/router/versions", response_model=schemas.RouterVersions)
    async def router_versions() -> dict[str, Any]:
        """The routers reporting to this control plane now, each with the llmgw version and protocol it says
        (``llmgw version`` lists them, marking a skew)."""
        return {"routers": [dataclasses.asdict(r) for r in cluster.signals.seen()]}

    @api.post("/api/v1/router/events", response_model=schemas.Applied)
    async def router_report(request: Request) -> dict[str, Any]:
        """A router's ejections and recoveries of replicas (``llmgw.api.reports.RouterReport`` is the shape)."""
        doc = read_json(await request.body(), limit=MAX_BODY)
        try:
            applied = reports.record(doc)  # type: ignore[arg-type]  # record refuses what is not a mapping
        except BadReport as e:
            raise Unprocessable(str(e), code="invalid_report") from None
        return {"applied": applied}

    @api.post("/api/v1/router/signals", response_model=schemas.Applied)
    async def router_signals(request: Request) -> dict[str, Any]:
        """A router's load report per model (``llmgw.router.signals`` builds it): the autoscaler's input."""
        doc = read_json(await request.body(), limit=MAX_BODY)
        try:
            applied = cluster.signals.record(doc)
        except loadreports.BadReport as e:
            raise Unprocessable(str(e), code="invalid_report") from None
        return {"applied": applied}

    return api
