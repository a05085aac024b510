"""A router hub's answers over a static table (``router.hub``): ``quota`` and ``usage`` from an in-memory ledger
holding the table's key and project limits, so they hold across the hub's workers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from llmgw.api import usage as wire
from llmgw.router import budgets, ledger
from llmgw.router import table as table_mod


def error(status: int, message: str) -> web.Response:
    """An error answer as the control plane's API words one."""
    return web.json_response({"error": {"message": message}}, status=status)


class LocalLedger:
    """``quota`` and ``usage`` answered from an in-memory ledger (a static table); load reports dropped."""

    def __init__(self, limits: dict[tuple[str, str], int]) -> None:
        self.ledger = ledger.Ledger(limits, keep_records=False)

    async def __call__(self, path: str, body: bytes) -> web.Response:
        try:
            doc = json.loads(body)
            if path == wire.QUOTA_PATH:
                return web.json_response((await self.ledger.sync(wire.QuotaSync.from_doc(doc))).to_doc())
            if path == wire.USAGE_PATH:
                return web.json_response((await self.ledger.ingest(wire.UsageBatch.from_doc(doc))).to_doc())
        except ValueError as exc:  # BadReport and bad JSON alike
            return error(400, str(exc))
        return web.json_response({})


def table_limits(doc: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """The budgets a table's keys and projects set, as a ledger takes them: (scope, kind) -> units."""
    auth = table_mod.RouteTable.from_doc(doc).auth
    out: dict[tuple[str, str], int] = {}
    scopes = [(f"key:{k.id}", budgets.with_minute(k.limits, k.rpm, k.tpm)) for k in auth.by_hash.values()]
    scopes += [(f"project:{name}", limits) for name, limits in auth.projects.items()]
    for scope, limits in scopes:
        for kind in limits.in_force():
            out[(scope, kind)] = limits.units(kind)
    return out
