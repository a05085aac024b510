"""The server about itself: ``/healthz``, ``/api/v1/whoami`` (the caller) and ``/api/v1/controlplanes``."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request

from llmgw.control.auth import middleware as auth_mw
from llmgw.control.http import forward as forward_http
from llmgw.control.http import schemas


def router(leadership: forward_http.View | None) -> APIRouter:
    """``leadership`` (``leader.Leadership``) is what ``controlplanes`` lists; None (a single server): none."""
    api = APIRouter()

    @api.get("/healthz", response_model=schemas.Health)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/api/v1/whoami", response_model=schemas.WhoAmI)
    async def whoami(request: Request) -> dict[str, Any]:
        """The caller as the API sees it: its name, role and kind (the UI's header; what a viewer may do)."""
        who = request.scope.get(auth_mw.PRINCIPAL)
        if who is None:  # the auth middleware always sets one; a bare app in a unit test may not
            return {"name": "", "role": "", "kind": ""}
        return {"name": who.name, "role": who.role, "kind": who.kind}

    @api.get("/api/v1/controlplanes", response_model=schemas.ControlPlanes)
    async def controlplanes() -> dict[str, Any]:
        """Every control plane as last read from the database: role, term, lease age, addresses, version."""
        if leadership is None:
            return {"controlplanes": [], "self": ""}
        return {"controlplanes": [dataclasses.asdict(i) for i in leadership.describe()], "self": leadership.me.id}

    return api
