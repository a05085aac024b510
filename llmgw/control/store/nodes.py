"""The store's nodes (inventory, labels, cordon and drain) and the certificates the CA signed for them."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from llmgw.control.store.base import StoreBase, db_text
from llmgw.control.store.tables import NodeCertRow, NodeRow, ReplicaRow, TokenRow
from llmgw.core.inventory import Inventory, inventory_from_dict


@dataclasses.dataclass(frozen=True, slots=True)
class StoredNode:
    id: str
    hostname: str
    mgmt_addr: str
    agent_version: str
    inventory: Inventory
    labels: dict[str, str]
    first_seen: float
    last_seen: float
    cordoned: bool = False
    draining: bool = False



@dataclasses.dataclass(frozen=True, slots=True)
class StoredNodeCert:
    """A node certificate the CA signed, by serial (lower-case hex)."""

    serial: str
    node_id: str
    issued_at: float
    not_after: float
    revoked_at: float = 0.0  # 0: not revoked


#: Gpu fields this release added that the previous release's reader (0.1.0,
#: ``Gpu(**doc)``) would refuse as unexpected keywords. They are live readings,
#: not facts to keep, so the stored document leaves them out and a node read
#: back from the store has them unknown until its next heartbeat.
_LIVE_GPU_FIELDS = ("utilization_percent",)


def inventory_to_doc(inv: Inventory) -> dict[str, Any]:
    doc = dataclasses.asdict(inv)
    for gpu in doc.get("gpus", ()):
        for key in _LIVE_GPU_FIELDS:
            gpu.pop(key, None)
    return doc


def inventory_from_doc(doc: dict[str, Any]) -> Inventory:
    return inventory_from_dict(doc)


def _node(r: Any) -> StoredNode:
    """A node from a row of the nodes table's columns: a plain row or a NodeRow."""
    return StoredNode(r.id, r.hostname, r.mgmt_addr, r.agent_version, inventory_from_doc(r.inventory),
                      dict(r.labels or {}), r.first_seen, r.last_seen, bool(r.cordoned), bool(r.draining))


class NodeStore(StoreBase):
    """Registered nodes, their scheduling marks, and their certificates (join, renewal, revocation)."""

    # -- nodes -------------------------------------------------------------------
    def upsert_node(self, node: StoredNode) -> None:
        with self._tx() as s:
            row = s.get(NodeRow, node.id)
            if row is None:
                row = NodeRow(id=node.id, first_seen=node.first_seen)
                s.add(row)
            row.hostname, row.mgmt_addr = db_text(node.hostname), db_text(node.mgmt_addr)
            row.agent_version = db_text(node.agent_version)
            row.inventory, row.labels = inventory_to_doc(node.inventory), dict(node.labels)
            row.last_seen = node.last_seen

    def touch_nodes(self, last_seen: dict[str, float]) -> None:
        with self._tx() as s:
            for node_id, ts in last_seen.items():
                row = s.get(NodeRow, node_id)
                if row is not None:
                    row.last_seen = ts

    def list_nodes(self) -> list[StoredNode]:
        with self._session() as s:
            return [_node(r) for r in s.scalars(sa.select(NodeRow).order_by(NodeRow.id))]

    def page_nodes(self, *, offset: int = 0, limit: int = 0) -> tuple[list[StoredNode], int]:
        """The nodes by id from ``offset``, ``limit`` of them (0: all), and how many there are in all.

        Only the page's rows are read and decoded: the UI's page of 100 out of 1,000 nodes read all
        1,000 inventories (0.4 s of the overview's 0.55 s, bench/ui_overview.py). Plain rows, not ORM
        objects: building the ORM's identity state was half of that read.
        """
        cols = (NodeRow.id, NodeRow.hostname, NodeRow.mgmt_addr, NodeRow.agent_version, NodeRow.inventory,
                NodeRow.labels, NodeRow.first_seen, NodeRow.last_seen, NodeRow.cordoned, NodeRow.draining)
        q = sa.select(*cols).order_by(NodeRow.id).offset(offset)
        with self._session() as s:
            total = int(s.execute(sa.select(sa.func.count()).select_from(NodeRow)).scalar_one())
            rows = s.execute(q.limit(limit) if limit else q).all()
        return [_node(r) for r in rows], total

    def get_node(self, node_id: str) -> StoredNode | None:
        """One node by id, or None; one row read (the node page polls this every 2 s, not every node's inventory)."""
        with self._session() as s:
            r = s.get(NodeRow, node_id)
            if r is None:
                return None
            return _node(r)

    def occupied_nodes(self) -> set[str]:
        """Every node some replica is on (a multi-node replica: each rank's), from two columns of each row."""
        with self._session() as s:
            rows = s.execute(sa.select(ReplicaRow.node_id, ReplicaRow.members)).all()
        return {n for node_id, members in rows
                for n in (node_id, *(str(m.get("node_id") or "") for m in (members or ()))) if n}

    def set_node_scheduling(self, node_id: str, *, cordoned: bool, draining: bool) -> bool:
        """Marks a node cordoned and/or draining; False when no such node registered."""
        with self._tx() as s:
            row = s.get(NodeRow, node_id)
            if row is None:
                return False
            row.cordoned, row.draining = cordoned, draining
            return True

    # -- node certificates (agentsvc's join, renewal and revocation) ----------------------
    def add_node_cert(self, cert: StoredNodeCert) -> None:
        with self._tx() as s:
            s.add(NodeCertRow(serial=cert.serial, node_id=cert.node_id, issued_at=cert.issued_at,
                              not_after=cert.not_after, revoked_at=cert.revoked_at))

    def get_node_cert(self, serial: str) -> StoredNodeCert | None:
        with self._session() as s:
            r = s.get(NodeCertRow, serial)
            return None if r is None else StoredNodeCert(r.serial, r.node_id, r.issued_at, r.not_after,
                                                         r.revoked_at)

    def list_node_certs(self, *, node_id: str | None = None) -> list[StoredNodeCert]:
        q = sa.select(NodeCertRow).order_by(NodeCertRow.issued_at)
        if node_id is not None:
            q = q.where(NodeCertRow.node_id == node_id)
        with self._session() as s:
            return [StoredNodeCert(r.serial, r.node_id, r.issued_at, r.not_after, r.revoked_at) for r in s.scalars(q)]

    def admit_node(self, token_id: str, cert: StoredNodeCert, *, now: float) -> int | None:
        """A join's writes in one transaction: one use of the token, every earlier certificate of the node
        revoked, the new one stored. None (and nothing written) when the token had no use left; else how
        many earlier certificates were revoked. A refused join never gets here, so it spends no use."""
        with self._tx() as s:
            spent = s.execute(sa.update(TokenRow).where(TokenRow.id == token_id, TokenRow.uses_left > 0,
                                                        TokenRow.expires_at > now)
                              .values(uses_left=TokenRow.uses_left - 1)).rowcount
            if not spent:
                return None
            revoked = s.execute(sa.update(NodeCertRow).where(NodeCertRow.node_id == cert.node_id,
                                                             NodeCertRow.revoked_at == 0)
                                .values(revoked_at=now)).rowcount
            s.add(NodeCertRow(serial=cert.serial, node_id=cert.node_id, issued_at=cert.issued_at,
                              not_after=cert.not_after, revoked_at=cert.revoked_at))
            return int(revoked)

    def revoke_node_certs(self, node_id: str, *, at: float) -> int:
        """Revokes every unrevoked certificate of a node; returns how many."""
        with self._tx() as s:
            return int(s.execute(sa.update(NodeCertRow).where(NodeCertRow.node_id == node_id,
                                                              NodeCertRow.revoked_at == 0)
                                 .values(revoked_at=at)).rowcount)
