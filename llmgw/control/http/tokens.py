"""``POST /api/v1/tokens``: a join token made over REST by an administrator, from anywhere.

Before, `llmgw token create` worked only on the control plane's host, reading its data directory, and
printed join port 8082 whatever port the server listened on. The answer here carries the join command
with this server's own advertised join address (``--advertise-address`` or its host, and the join port
it really listens on) and the cluster CA's hash, so the command it prints is one this cluster honours.

The token's secret is in the answer only: the store keeps its hash (``control.tokens``), the audit log
records the token's id (its public half), never the answer's body. Administrators only: a join token
makes a node, which runs whatever the cluster's models say.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pydantic
from fastapi import APIRouter, Request

from llmgw.control import tokens
from llmgw.control.agentsvc import join as join_mod
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.auth import principals
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import Conflict, Forbidden, Unprocessable
from llmgw.control.store.offloop import StoreThread
from llmgw.core.errors import LlmgwError

#: The longest a join token may live, and the most nodes one may join (the fleet simulator joins thousands).
MAX_TTL_S = 30 * 86400.0
MAX_USES = 1_000_000
_ADMIN = principals.Need(principals.ADMIN)


@dataclasses.dataclass(frozen=True, slots=True)
class JoinPoint:
    """Where agents join this control plane: ``HOST:PORT`` as they dial it, and the CA hash they check."""

    address: str
    ca_hash: str


class TokenCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    ttl_s: float = pydantic.Field(default=3600.0, gt=0, le=MAX_TTL_S, allow_inf_nan=False)
    uses: int = pydantic.Field(default=1, ge=1, le=MAX_USES)
    node: str = pydantic.Field(default="", max_length=64)


class JoinToken(schemas.Body):
    """A join token (its secret shown this once) and the command that joins a node with it."""

    id: str
    token: str
    expires_at: float
    uses: int
    node: str
    server: str
    ca_hash: str
    command: str


def join_command(point: JoinPoint, token: str) -> str:
    return f"llmgw agent join --server {point.address} --token {token} --ca-hash {point.ca_hash}"


def router(db: StoreThread, join: JoinPoint | None) -> APIRouter:
    """``join``: this control plane's join point; None (``--insecure``): nodes do not join, tokens are refused."""
    r = APIRouter()

    @r.post("/api/v1/tokens", status_code=201, response_model=JoinToken)
    async def create_token(body: TokenCreate, request: Request) -> dict[str, Any]:
        """A join token (shown this once) and the `llmgw agent join` command that uses it; administrators only."""
        who = request.scope.get(auth_mw.PRINCIPAL)
        if who is not None and not _ADMIN.allows(who):
            # The permission table lets operators POST; a token makes a node, so this one is the admin's.
            raise Forbidden(who, _ADMIN, "POST", "/api/v1/tokens")
        if join is None:
            raise Conflict("this control plane runs with --insecure: nodes do not join, they connect in plaintext with "
                           "`llmgw agent --insecure --server HOST:PORT`", code="insecure")
        if body.node and (why := join_mod.check_node_id(body.node)):
            raise Unprocessable(why, code="invalid_node", param="node")
        try:
            token_id, secret = await db.call(tokens.create_token, db.store, ttl_s=body.ttl_s, uses=body.uses,
                                             node_name=body.node)
        except LlmgwError as e:
            raise Unprocessable(str(e), code="invalid_token") from None
        token = f"{token_id}.{secret}"
        return {"id": token_id, "token": token, "expires_at": time.time() + body.ttl_s, "uses": body.uses,
                "node": body.node, "server": join.address, "ca_hash": join.ca_hash,
                "command": join_command(join, token)}

    return r
