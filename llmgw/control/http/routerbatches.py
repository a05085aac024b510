"""What routers ask and tell of batch lines (issue 32): ``POST /api/v1/router/batch/claim`` (a ``LineClaim``,
answered with the lines held for the router) and ``POST /api/v1/router/batch/results`` (``LineResults``, each
line's answer written once). Only a router's credential reaches these (``auth.principals``); ``api.batches``
describes both documents and ``control.batches.service`` does the work, the same the in-process router awaits.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from llmgw.api.batches import CLAIM_PATH, RESULTS_PATH, LineClaim, LineResults
from llmgw.api.reports import BadReport
from llmgw.control.batches.service import BatchService
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import Unprocessable, read_json

#: Results of 1000 lines, each an engine's whole answer.
MAX_BODY = 64 << 20


class BatchLine(schemas.Body):
    batch: str
    idx: int
    custom_id: str
    model: str
    url: str
    body: str
    project: str
    key: str
    user: str


class ClaimedLines(schemas.Body):
    """The lines held for this router for ``lease_s`` seconds: run them, then post their results."""

    lines: list[BatchLine]
    lease_s: schemas.Number


class ResultsAck(schemas.Body):
    """``written``: lines answered now (a line answered already keeps its first answer); ``stopped``: batches no
    longer running, whose held lines the router gives back unrun."""

    written: int
    stopped: list[str]


def router(service: BatchService) -> APIRouter:
    api = APIRouter()

    @api.post(CLAIM_PATH, response_model=ClaimedLines)
    async def router_batch_claim(request: Request) -> dict[str, Any]:
        """A router's claim of batch lines for the models it has room for (``llmgw.api.batches.LineClaim``)."""
        try:
            claim = LineClaim.from_doc(read_json(await request.body(), limit=MAX_BODY))
        except BadReport as e:
            raise Unprocessable(str(e), code="invalid_report", param=str(e).split(" ", 1)[0]) from None
        return (await service.claim(claim)).to_doc()

    @api.post(RESULTS_PATH, response_model=ResultsAck)
    async def router_batch_results(request: Request) -> dict[str, Any]:
        """A router's answers to the lines it ran (``llmgw.api.batches.LineResults``); each written once."""
        try:
            results = LineResults.from_doc(read_json(await request.body(), limit=MAX_BODY))
        except BadReport as e:
            raise Unprocessable(str(e), code="invalid_report", param=str(e).split(" ", 1)[0]) from None
        return (await service.results(results)).to_doc()

    return api
