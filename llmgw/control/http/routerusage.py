"""What routers send of usage and quotas: ``POST /api/v1/router/usage`` (a ``UsageBatch``, stored once)
and ``POST /api/v1/router/quota`` (a ``QuotaSync``, answered out of the ledger). Only a router's
credential reaches these (``auth.principals``); ``api.usage`` describes both documents and
``control.usage.service`` does the work, the same the in-process router awaits directly.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter, Request

from llmgw.api.reports import BadReport
from llmgw.api.usage import QUOTA_PATH, USAGE_PATH, QuotaSync, UsageBatch
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import Unprocessable, read_json
from llmgw.control.usage.service import UsageService

#: A batch of 5000 records is about 1.5 MB of JSON.
MAX_BODY = 4 << 20


class UsageAck(schemas.Body):
    """Every record of the journal with ``seq`` up to ``applied_through`` is stored: the router may forget them."""

    journal: str
    applied_through: int


class QuotaGrant(schemas.Body):
    budget: str
    granted: int
    held: int
    limit: int
    charged: int
    free: int
    reset_at: schemas.Number | None = pydantic.Field(description="when the budget's period ends; null: never "
                                                                 "(concurrency)")


class QuotaAnswer(schemas.Body):
    items: list[QuotaGrant]


def router(service: UsageService) -> APIRouter:
    api = APIRouter()

    @api.post(USAGE_PATH, response_model=UsageAck)
    async def router_usage(request: Request) -> dict[str, Any]:
        """A router journal's metered requests (``llmgw.api.usage.UsageBatch``); stored once, however often sent."""
        doc = read_json(await request.body(), limit=MAX_BODY)
        try:
            batch = UsageBatch.from_doc(doc)
        except BadReport as e:
            raise Unprocessable(str(e), code="invalid_report", param=_field(e)) from None
        return (await service.ingest(batch)).to_doc()

    @api.post(QUOTA_PATH, response_model=QuotaAnswer)
    async def router_quota(request: Request) -> dict[str, Any]:
        """A router's quota sync (``llmgw.api.usage.QuotaSync``): consumed, returned and wanted units per budget."""
        doc = read_json(await request.body(), limit=MAX_BODY)
        try:
            answer = await service.sync(QuotaSync.from_doc(doc))
        except BadReport as e:
            raise Unprocessable(str(e), code="invalid_report", param=_field(e)) from None
        return answer.to_doc()

    return api


def _field(e: BadReport) -> str:
    """The field a refusal names first (``records[3].seq``, ``items[0].budget``)."""
    return str(e).split(":", 1)[0].split(" ", 1)[0]
