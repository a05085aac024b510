"""``/api/v1/settings``: the cluster's spec policy (issue 24), read by anyone logged in, changed by an admin.

``GET`` answers the whole document (``llmgw.control.store.settings.ClusterSettings``); ``PUT`` takes the
keys to change and answers the document with ``changed``, the keys whose value changed: what the audit
log records as the object of ``settings set`` (the values are no secret, but the log keeps names only).
The permission table (``principals.required``) makes a change an admin's.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter, Request

from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http.apierrors import Unprocessable
from llmgw.control.store import settings as settings_store
from llmgw.control.store.offloop import StoreThread

PATH = "/api/v1/settings"


async def current(db: StoreThread) -> settings_store.ClusterSettings:
    """The settings in force, read on the store's thread (an apply reads them for its check)."""
    return await db.call(settings_store.read, db.store)


class SettingsChanged(settings_store.ClusterSettings):
    """The settings in force after a change, and which keys it changed."""

    changed: list[str] = pydantic.Field(description="The keys whose value changed")


def router(db: StoreThread) -> APIRouter:
    api = APIRouter()

    @api.get(PATH, response_model=settings_store.ClusterSettings)
    async def get_settings() -> dict[str, Any]:
        return (await current(db)).model_dump()

    @api.put(PATH, response_model=SettingsChanged)
    async def put_settings(body: settings_store.SettingsChange, request: Request) -> dict[str, Any]:
        """Changes the keys given; a key left out keeps its value."""
        try:
            values = body.values()
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(x) for x in first.get("loc", ())) or "settings"
            raise Unprocessable(f"{field}: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}",
                                code="invalid_setting", param=field) from None
        who = request.scope.get(PRINCIPAL)
        changed = await db.call(settings_store.write, db.store, values, by=who.name if who is not None else "")
        return {**(await current(db)).model_dump(), "changed": changed}

    return api
