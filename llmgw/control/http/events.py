"""``GET /api/v1/events``: what happened to models, replicas and nodes, oldest first, for reading and following."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Response

from llmgw.control.events import Event
from llmgw.control.http import modeldocs, paging, schemas
from llmgw.control.store.offloop import StoreThread


def _events_body(events: list[Event]) -> bytes:
    return json.dumps({"items": [modeldocs.event_doc(e) for e in events]}).encode()


def router(db: StoreThread) -> APIRouter:
    api = APIRouter()

    @api.get("/api/v1/events", response_model=schemas.EventList)
    async def list_events(object: str | None = None, model: str | None = None, node: str | None = None,
                          since: float | None = paging.since_time(), after: int = paging.after_id(),
                          limit: int = paging.limit(default=500)) -> Response:
        """Events, oldest first; ``model``/``node`` include their replicas'; ``after`` an id, for following."""
        items = await db.list_events(obj=object, model=model, node=node, since=since, after_id=after, limit=limit)
        # Made JSON off the loop too: a page of 500 took ~25 ms of the loop's time as dicts through
        # FastAPI's encoder, as long as the query itself, on every page `llmgw events` reads.
        return Response(await asyncio.to_thread(_events_body, items), media_type="application/json")

    return api
