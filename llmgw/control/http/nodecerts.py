"""``/api/v1/nodes/{name}/certificates`` and ``/revoke``: the certificates the cluster CA signed for a node.

Revoking marks every certificate of the node revoked in the store and closes its stream at once
(``Cluster.revoke_node``); the agent service checks the store at each Connect, so the node stays out
until it joins again with a new token. Only serials and dates are served: a certificate is not a
secret, but nothing here needs one.
"""

from __future__ import annotations

from typing import Any, Protocol

import pydantic
from fastapi import APIRouter

from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import StoredNodeCert


class _Revoker(Protocol):
    async def revoke_node(self, node_id: str) -> int: ...

    def connected(self, node_id: str) -> bool: ...


class Cert(schemas.Body):
    serial: str
    node: str
    issued_at: schemas.Number
    not_after: schemas.Number
    revoked_at: schemas.Number | None = pydantic.Field(description="null: not revoked")


class CertList(schemas.Body):
    items: list[Cert]


class Revoked(schemas.Body):
    node: str
    revoked: int
    disconnected: bool


def cert_doc(cert: StoredNodeCert) -> dict[str, Any]:
    return {"serial": cert.serial, "node": cert.node_id, "issued_at": cert.issued_at, "not_after": cert.not_after,
            "revoked_at": cert.revoked_at or None}


def router(db: StoreThread, cluster: _Revoker) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/nodes/{node_id}/certificates", response_model=CertList)
    async def list_certificates(node_id: str) -> dict[str, Any]:
        """The node's certificates, oldest first: serial, issue and expiry times, when revoked (null: valid)."""
        return {"items": [cert_doc(c) for c in await db.call(db.store.list_node_certs, node_id=node_id)]}

    @r.post("/api/v1/nodes/{node_id}/revoke", response_model=Revoked)
    async def revoke(node_id: str) -> dict[str, Any]:
        """Revokes every certificate of the node and closes its stream; it must join again to come back."""
        was_connected = cluster.connected(node_id)
        count = await cluster.revoke_node(node_id)
        if count == 0 and not await db.call(db.store.list_node_certs, node_id=node_id):
            raise NotFound("node", node_id, "`llmgw get nodes` lists the nodes",
                           says="has no certificate from this control plane")
        return {"node": node_id, "revoked": count, "disconnected": was_connected}

    return r
