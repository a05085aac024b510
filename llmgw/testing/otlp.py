"""A real OTLP/HTTP traces receiver for tests: it decodes what an OpenTelemetry exporter POSTs and keeps the spans."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from llmgw.testing.threaded import ThreadedApp


class Collector(ThreadedApp):
    """An OTLP/HTTP traces receiver on 127.0.0.1 that keeps every span it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[Any] = []
        self.content_types: list[str] = []

    async def _traces(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/traces", self._traces)
