"""Single sign-on's lines in the audit log: each sign-in, each refusal (with its sentence), each user whose
access a refresh ended. The actor is ``sso@PEER`` for a refused sign-in (the user is not proved),
``user:NAME (sso@PEER)`` for one that succeeded, and ``system:sso-refresh`` for the refresher."""

from __future__ import annotations

import logging

from llmgw.control.sso.refusals import SsoRefused
from llmgw.control.store.base import Fenced
from llmgw.control.store.offloop import StoreThread

log = logging.getLogger(__name__)


async def record(db: StoreThread, *, actor: str, action: str, user: str, outcome: str, detail: str = "") -> None:
    try:
        await db.call(db.store.record_audit, actor=actor, action=action, object=f"user/{user or '?'}",
                      outcome=outcome, detail=detail)
    except Fenced as e:  # a standby: the leader records what reaches it
        log.info("sso audit entry not written (%s): %s %s %s", e, action, user, outcome)


async def refused(db: StoreThread, e: SsoRefused, *, peer: str, action: str) -> None:
    log.warning("%s from %s refused: %s", action, peer or "unknown", e.message)
    await record(db, actor=f"sso@{peer or 'unknown'}", action=action, user=e.user, outcome="refused",
                 detail=f"{e.code}: {e.message}")
