"""The store: the only module that speaks SQL.

SQLite by default, in the data directory; the schema is created and upgraded
by Alembic migrations at open, so a second ``llmgw server`` on an older data
directory upgrades it instead of failing on a missing column. Callers get and
give ``llmgw.core``/``llmgw.control.state`` objects, never rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from sqlalchemy import event
from sqlalchemy.orm import Session, defer, sessionmaker

from llmgw.control.conditions import Condition
from llmgw.control.events import Event
from llmgw.control.reconcile.engines import ScopedWant
from llmgw.control.state import Member, Phase, ReplicaRecord
from llmgw.control.store.tables import (
    ApiKeyRow,
    ApiTokenRow,
    AuditRow,
    AutoscaleRow,
    ControlPlaneRow,
    EngineWantRow,
    EventRow,
    LeaseRow,
    ModelRow,
    NodeCertRow,
    NodeRow,
    ReplicaRow,
    SettingRow,
    TokenRow,
    UserRow,
)
from llmgw.core import specs
from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Inventory, inventory_from_dict

log = logging.getLogger(__name__)
MIGRATIONS = pathlib.Path(__file__).with_name("migrations")
#: Events kept; older ones are pruned as new ones are written, so the table never grows without bound.
EVENTS_KEPT = 10_000
#: How an audited action ended: done (2xx), refused as asked (4xx), or broken on our side (5xx).
AUDIT_OUTCOMES = ("ok", "refused", "failed")
#: The PostgreSQL advisory lock held while migrating (any fixed 64-bit number; this one spells "llmgwmig").
MIGRATION_LOCK_KEY = 0x6C6C6D67776D6967
#: The URL schemes the store opens: SQLite (the embedded default) and PostgreSQL through psycopg 3.
URL_SCHEMES = ("sqlite", "postgresql+psycopg")


class StoreUrlRefused(LlmgwError, ValueError):
    """A database URL the store does not open; the message says which kinds it does."""


class StoreUnreachable(LlmgwError, RuntimeError):
    """The database did not answer at open; the message names it (password hidden) and what to check."""


class Fenced(LlmgwError, RuntimeError):
    """A write refused because this control plane does not hold the lease at its term (see ``Store.fence``)."""


class KeyIdTaken(LlmgwError, ValueError):
    """A new API key's id is another key's already (``Store.add_key``); the caller draws another."""


#: ``Store.fence`` of a standby: it holds no term, so it writes nothing of the cluster's state.
STANDBY = ("", 0)


def unreachable(e: BaseException) -> str:
    """The first line of why, when ``e`` says the database did not answer (down, restarting, cut off); "" else."""
    if isinstance(e, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return (str(e.orig or e).strip().splitlines() or [type(e).__name__])[0]
    return ""


def sqlite_url(data_dir: pathlib.Path) -> str:
    """The embedded default: ``llmgw.db`` in the data directory."""
    return f"sqlite:///{data_dir / 'llmgw.db'}"


def check_url(url: str) -> None:
    """Raises StoreUrlRefused unless ``url`` is one the store opens."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in URL_SCHEMES:
        # Say the shape, never the URL itself: it may carry a password.
        raise StoreUrlRefused(f"database URL scheme {scheme or '(none)'!r} is not supported: use "
                              "postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DB for PostgreSQL, or leave "
                              "--database out for SQLite in the data directory")


@dataclasses.dataclass(frozen=True, slots=True)
class StoredModel:
    model: specs.Model
    generation: int
    created_at: float
    updated_at: float


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
class StoredKey:
    """An API key as stored: its hash, never its secret."""

    id: str
    name: str
    sha256: str
    models: tuple[str, ...] = ()  # empty: every model
    rpm: int = 0  # 0: unlimited
    tpm: int = 0  # 0: unlimited
    priority: int = 0
    created_at: float = 0.0
    disabled: bool = False
    last_used_at: float = 0.0  # 0: never used


@dataclasses.dataclass(frozen=True, slots=True)
class StoredToken:
    """A bootstrap token as stored: its id and the hash of its secret, never the secret."""

    id: str
    sha256: str
    node_name: str  # empty: the node id the agent asks for
    expires_at: float
    uses_left: int
    created_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoredUser:
    """A user as stored: an argon2 hash, never the password."""

    name: str
    role: str
    password_hash: str
    created_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoredApiToken:
    """A REST credential as stored: its id and the hash of its secret, never the secret."""

    id: str
    sha256: str
    kind: str  # user, session or router
    subject: str  # the user's name or the router's
    created_at: float
    expires_at: float = 0.0  # 0: until deleted
    last_used_at: float = 0.0
    label: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class StoredNodeCert:
    """A node certificate the CA signed, by serial (lower-case hex)."""

    serial: str
    node_id: str
    issued_at: float
    not_after: float
    revoked_at: float = 0.0  # 0: not revoked


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """The leader lease as stored: who holds it, its term (the fencing token), until when, and where it serves."""

    holder: str
    term: int
    expires_at: float
    renewed_at: float
    address: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class StoredControlPlane:
    """A control plane instance as it last wrote itself; its role comes from the lease."""

    id: str
    http_url: str
    agent_addr: str
    version: str
    started_at: float
    last_seen: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoredAutoscale:
    """One autoscaled model's autoscaler state as stored (``core.autoscale.State``'s fields, and the last reason)."""

    model: str
    replicas: int
    above_since: float | None = None
    below_since: float | None = None
    idle_since: float | None = None
    last_scale_up_at: float = 0.0
    last_change_at: float = 0.0
    #: The sentence of the last change of count; "" before the first.
    last_reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the audit log; ``detail`` says why it was refused or failed, never a secret or a body."""

    id: int
    at: float
    actor: str
    action: str
    object: str
    outcome: str
    detail: str = ""


def _key_from_row(row: ApiKeyRow) -> StoredKey:
    return StoredKey(id=row.id, name=row.name, sha256=row.sha256, models=tuple(row.models or ()), rpm=row.rpm,
                     tpm=row.tpm, priority=row.priority, created_at=row.created_at, disabled=row.disabled,
                     last_used_at=row.last_used_at or 0.0)


def inventory_to_doc(inv: Inventory) -> dict[str, Any]:
    return dataclasses.asdict(inv)


def inventory_from_doc(doc: dict[str, Any]) -> Inventory:
    return inventory_from_dict(doc)


def _replica_from_row(row: Any) -> ReplicaRecord:
    """A record from a row of the replicas table's columns (``conditions`` not needed): a plain row or a ReplicaRow."""
    return ReplicaRecord(
        id=row.id, model=row.model, fingerprint=row.fingerprint, phase=Phase(row.phase), api_key=row.api_key,
        node_id=row.node_id, shard_id=row.shard_id, attempt=row.attempt, failures=row.failures,
        next_attempt_at=row.next_attempt_at, started_at=row.started_at, sent_at=row.sent_at,
        ready_at=row.ready_at, endpoint=row.endpoint, message=row.message,
        last_output=tuple(row.last_output or ()), created_at=row.created_at,
        gpus=tuple(int(g) for g in (row.gpus or ())), memory_bytes=int(row.memory_bytes or 0),
        memory_estimated=bool(row.memory_estimated),
        members=tuple(_member_from_doc(m) for m in (row.members or ())),
        leader_addr=row.leader_addr or "", leader_port=int(row.leader_port or 0),
    )


def _member_to_doc(m: Member) -> dict[str, Any]:
    return {"rank": m.rank, "node_id": m.node_id, "shard_id": m.shard_id, "gpus": list(m.gpus),
            "hcas": list(m.hcas)}


def _member_from_doc(doc: dict[str, Any]) -> Member:
    return Member(rank=int(doc["rank"]), node_id=str(doc["node_id"]), shard_id=str(doc["shard_id"]),
                  gpus=tuple(int(g) for g in doc.get("gpus", ())), hcas=tuple(str(h) for h in doc.get("hcas", ())))


def _text(s: str) -> str:
    """Text as every database stores it: PostgreSQL refuses a NUL in a text column ("text fields cannot
    contain NUL"), which an engine's output in a replica's message or an event can carry; SQLite took it."""
    return s.replace("\x00", "\ufffd")


def _fill_replica_row(row: ReplicaRow, r: ReplicaRecord, now: float) -> None:
    row.model, row.fingerprint, row.phase, row.api_key = r.model, r.fingerprint, r.phase.value, r.api_key
    row.node_id, row.shard_id, row.attempt, row.failures = r.node_id, r.shard_id, r.attempt, r.failures
    row.next_attempt_at, row.started_at, row.sent_at = r.next_attempt_at, r.started_at, r.sent_at
    row.ready_at, row.endpoint, row.message = r.ready_at, _text(r.endpoint), _text(r.message)
    row.last_output, row.updated_at = list(r.last_output), now
    row.gpus, row.memory_bytes, row.memory_estimated = list(r.gpus), r.memory_bytes, r.memory_estimated
    row.members = [_member_to_doc(m) for m in r.members]
    row.leader_addr, row.leader_port = r.leader_addr, r.leader_port


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        sqlite = url.startswith("sqlite")
        # pool_pre_ping: a PostgreSQL that restarted leaves dead connections in the pool; without it the
        # first statement after the restart fails instead of reconnecting.
        self.engine = sa.create_engine(url, connect_args={"check_same_thread": False} if sqlite else {},
                                       pool_pre_ping=not sqlite)
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        #: (holder, term) every write must find in the lease row, in its own transaction; ``STANDBY``: no
        #: write at all; None: unchecked (one server without election: the CLI, ``llmgw init``, unit tests).
        self.fence: tuple[str, int] | None = None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Session]:
        """A write transaction, fenced: the lease row is read (FOR SHARE on PostgreSQL) before anything is
        written, and a term other than ``fence``'s rolls the whole transaction back with Fenced.

        The row lock is what makes it a fence and not a check: a standby's takeover (an UPDATE of that row)
        waits for the writes that read it to commit, and every write after the takeover sees the new term.
        So a leader that was paused past its lease (SIGSTOP, a VM migration, a long GC) and wakes up can
        finish no write, whatever its own clock says.
        """
        fence = self.fence
        with self._session.begin() as s:
            if fence is not None:
                self._check_fence(s, fence)
            yield s

    def _check_fence(self, s: Session, fence: tuple[str, int]) -> None:
        holder, term = fence
        if term == 0:
            raise Fenced("this control plane is a standby and writes nothing; the leader does")
        row = s.execute(sa.select(LeaseRow.holder, LeaseRow.term).where(LeaseRow.name == "leader")
                        .with_for_update(read=True)).first()
        if row is None or (row.holder, row.term) != (holder, term):
            now_held = f"held by {row.holder} at term {row.term}" if row is not None else "held by nobody"
            raise Fenced(f"this control plane led at term {term} and the lease is now {now_held}: it was deposed "
                         "(paused or cut off past its lease) and writes nothing more")

    def db_now(self) -> float:
        """The database server's clock, in seconds since the epoch: the one clock every lease time is on."""
        with self.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                return float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
            return float(conn.execute(sa.text("SELECT (julianday('now') - 2440587.5) * 86400.0")).scalar_one())

    @classmethod
    def open(cls, data_dir: pathlib.Path) -> Store:
        """Opens (creating and migrating as needed) the SQLite database in ``data_dir``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls.open_url(sqlite_url(data_dir))

    @classmethod
    def open_url(cls, url: str) -> Store:
        """Opens (migrating as needed) the database at a SQLAlchemy URL: ``sqlite:///…`` or
        ``postgresql+psycopg://…``. Raises StoreUrlRefused for any other kind."""
        check_url(url)
        store = cls(url)
        try:
            store.migrate()
        except sa.exc.OperationalError as e:
            store.close()
            where = sa.engine.make_url(url).render_as_string(hide_password=True)
            cause = str(e.orig or e).strip().splitlines()[0]
            raise StoreUnreachable(f"cannot reach the database {where}: {cause}; check that the server runs "
                                   "there and accepts this user, or fix --database") from None
        except BaseException:
            store.close()
            raise
        return store

    def migrate(self) -> None:
        """Upgrades the schema to the newest revision, once even when several servers start together.

        On PostgreSQL a transaction-scoped advisory lock is held around the upgrade: without it two
        servers starting at once against an empty database both see no ``alembic_version`` and both
        run CREATE TABLE, and the second fails with "relation already exists". The second waits on the
        lock, then finds the head revision and does nothing; the lock goes with the transaction, even on
        an error. SQLite is unchanged: one server per data directory.
        """
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            cfg.attributes["connection"] = conn
            alembic_command.upgrade(cfg, "head")

    def close(self) -> None:
        self.engine.dispose()

    # -- models ------------------------------------------------------------------
    def put_model(self, model: specs.Model, *, now: float | None = None) -> tuple[StoredModel, bool]:
        """Creates or replaces a model; returns it and whether it was new."""
        now = time.time() if now is None else now
        with self._tx() as s:
            row = s.get(ModelRow, model.name)
            created = row is None
            if row is None:
                row = ModelRow(name=model.name, manifest=model.to_manifest(), generation=1,
                               created_at=now, updated_at=now)
                s.add(row)
            elif row.manifest != model.to_manifest():
                row.manifest, row.generation, row.updated_at = model.to_manifest(), row.generation + 1, now
            return self._stored_model(row), created

    def _stored_model(self, row: ModelRow) -> StoredModel:
        return StoredModel(specs.parse_manifest(row.manifest, stored=True), row.generation, row.created_at,
                           row.updated_at)

    def get_model(self, name: str) -> StoredModel | None:
        with self._session() as s:
            row = s.get(ModelRow, name)
            return self._stored_model(row) if row else None

    def list_models(self) -> list[StoredModel]:
        with self._session() as s:
            q = sa.select(ModelRow).options(defer(ModelRow.conditions)).order_by(ModelRow.name)
            return [self._stored_model(r) for r in s.scalars(q)]

    def delete_model(self, name: str) -> bool:
        with self._tx() as s:
            row = s.get(ModelRow, name)
            if row is None:
                return False
            s.delete(row)
            return True

    # -- replicas ----------------------------------------------------------------
    def list_replicas(self) -> list[ReplicaRecord]:
        with self._session() as s:
            # Conditions are not part of a ReplicaRecord; decoding their JSON was the largest part of
            # this call, made every pass and on every `llmgw get replicas` (py-spy, bench/control_load.py).
            # Plain rows of the columns, not ORM objects: building their identity state and reading each
            # attribute through its descriptor was 0.12 s of 0.30 s for 2,000 replicas, every pass.
            cols = [c for c in ReplicaRow.__table__.columns if c.name != "conditions"]
            rows = s.execute(sa.select(*cols).order_by(ReplicaRow.created_at, ReplicaRow.id)).all()
            return [_replica_from_row(r) for r in rows]

    def list_replica_states(self) -> list[ReplicaRecord]:
        """Every replica as far as a model's status reads it (``status.summarize``): for summaries only, never
        for a decision or a write (fingerprint and key are empty; a record written back would lose its key).

        A Ready replica is counted by the database, not read: each stands as its model's one shared Ready
        record (id empty), since a status reads only its phase. The others are read with the seven fields
        their sentence needs (id, phase, node, failures, message and two times), oldest first. The models
        list read every whole replica, JSON columns and all, to count them: 0.19 s with 2,000 replicas
        (bench/ui_overview.py), every 2 s for each open overview.
        """
        ready = Phase.READY.value
        cols = (ReplicaRow.id, ReplicaRow.model, ReplicaRow.phase, ReplicaRow.node_id, ReplicaRow.failures,
                ReplicaRow.message, ReplicaRow.started_at, ReplicaRow.next_attempt_at)
        with self._session() as s:
            counts = s.execute(sa.select(ReplicaRow.model, sa.func.count()).where(ReplicaRow.phase == ready)
                               .group_by(ReplicaRow.model)).all()
            rows = s.execute(sa.select(*cols).where(ReplicaRow.phase != ready)
                             .order_by(ReplicaRow.created_at, ReplicaRow.id)).all()
        out = [ReplicaRecord(id=r.id, model=r.model, fingerprint="", phase=Phase(r.phase), api_key="",
                             node_id=r.node_id, failures=r.failures, message=r.message, started_at=r.started_at,
                             next_attempt_at=r.next_attempt_at) for r in rows]
        for model, n in counts:
            out += [ReplicaRecord(id="", model=model, fingerprint="", phase=Phase.READY, api_key="")] * int(n)
        return out

    def write_replicas(self, *, upserts: Iterable[ReplicaRecord] = (), deletes: Iterable[str] = (),
                       now: float | None = None) -> None:
        """Writes replica targets in one transaction."""
        now = time.time() if now is None else now
        with self._tx() as s:
            for r in upserts:
                row = s.get(ReplicaRow, r.id)
                if row is None:
                    row = ReplicaRow(id=r.id, created_at=r.created_at or now)
                    s.add(row)
                _fill_replica_row(row, r, now)
            for rid in deletes:
                row = s.get(ReplicaRow, rid)
                if row is not None:
                    s.delete(row)

    # -- nodes -------------------------------------------------------------------
    def upsert_node(self, node: StoredNode) -> None:
        with self._tx() as s:
            row = s.get(NodeRow, node.id)
            if row is None:
                row = NodeRow(id=node.id, first_seen=node.first_seen)
                s.add(row)
            row.hostname, row.mgmt_addr = _text(node.hostname), _text(node.mgmt_addr)
            row.agent_version = _text(node.agent_version)
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
            return [StoredNode(r.id, r.hostname, r.mgmt_addr, r.agent_version, inventory_from_doc(r.inventory),
                               dict(r.labels or {}), r.first_seen, r.last_seen, bool(r.cordoned), bool(r.draining))
                    for r in s.scalars(sa.select(NodeRow).order_by(NodeRow.id))]

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
        return [StoredNode(r.id, r.hostname, r.mgmt_addr, r.agent_version, inventory_from_doc(r.inventory),
                           dict(r.labels or {}), r.first_seen, r.last_seen, bool(r.cordoned), bool(r.draining))
                for r in rows], total

    def get_node(self, node_id: str) -> StoredNode | None:
        """One node by id, or None; one row read (the node page polls this every 2 s, not every node's inventory)."""
        with self._session() as s:
            r = s.get(NodeRow, node_id)
            if r is None:
                return None
            return StoredNode(r.id, r.hostname, r.mgmt_addr, r.agent_version, inventory_from_doc(r.inventory),
                              dict(r.labels or {}), r.first_seen, r.last_seen, bool(r.cordoned), bool(r.draining))

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

    # -- conditions ----------------------------------------------------------------
    def conditions(self) -> tuple[dict[str, tuple[Condition, ...]], dict[str, tuple[Condition, ...]]]:
        """(replica id -> its conditions, model name -> its conditions), as last written."""
        with self._session() as s:
            reps = {rid: _conds(docs) for rid, docs in s.execute(sa.select(ReplicaRow.id, ReplicaRow.conditions))}
            models = {name: _conds(docs) for name, docs in s.execute(sa.select(ModelRow.name, ModelRow.conditions))}
        return reps, models

    def set_conditions(self, *, replicas: dict[str, tuple[Condition, ...]] | None = None,
                       models: dict[str, tuple[Condition, ...]] | None = None) -> None:
        """Writes conditions of existing replicas and models (a row deleted meanwhile is skipped)."""
        with self._tx() as s:
            for rid, conds in (replicas or {}).items():
                row = s.get(ReplicaRow, rid)
                if row is not None:
                    row.conditions = [c.to_doc() for c in conds]
            for name, conds in (models or {}).items():
                mrow = s.get(ModelRow, name)
                if mrow is not None:
                    mrow.conditions = [c.to_doc() for c in conds]

    # -- events --------------------------------------------------------------------
    def add_events(self, events: Iterable[Event], *, keep: int = EVENTS_KEPT) -> list[Event]:
        """Appends events (returned with their ids) and drops all but the newest ``keep``."""
        rows = [EventRow(time=e.time, kind=e.kind, reason=e.reason[:64], object=e.object[:320],
                         model=e.model[:63], node=e.node[:253], message=_text(e.message)) for e in events]
        if not rows:
            return []
        with self._tx() as s:
            s.add_all(rows)
            s.flush()
            newest = rows[-1].id
            if newest > keep:
                s.execute(sa.delete(EventRow).where(EventRow.id <= newest - keep))
        return [_event(r) for r in rows]

    def list_events(self, *, obj: str | None = None, model: str | None = None, node: str | None = None,
                    since: float | None = None, after_id: int = 0, limit: int = 500) -> list[Event]:
        """The newest ``limit`` events that match, oldest first; ``model``/``node`` include their replicas'."""
        # Columns, not ORM objects: a page of 500 built 500 mapped instances with their state to make
        # 500 Events, ~6 young collections a page. Under a client paging events those collections ran
        # 90-190 times a second and promoted every agent stream's in-flight read (agentsvc/collector).
        # In ``Event``'s field order, for ``Event(*row)``.
        q = sa.select(EventRow.time, EventRow.kind, EventRow.reason, EventRow.object, EventRow.message,
                      EventRow.model, EventRow.node, EventRow.id).where(EventRow.id > after_id)
        if obj:
            q = q.where(EventRow.object == obj)
        if model:
            q = q.where(sa.or_(EventRow.model == model, EventRow.object == f"model/{model}"))
        if node:
            q = q.where(sa.or_(EventRow.node == node, EventRow.object == f"node/{node}"))
        if since is not None:
            q = q.where(EventRow.time >= since)
        with self._session() as s:
            rows = s.execute(q.order_by(EventRow.id.desc()).limit(limit)).all()
        return [Event(*r) for r in reversed(rows)]

    # -- API keys ----------------------------------------------------------------
    def add_key(self, key: StoredKey) -> StoredKey:
        """Stores a new key; KeyIdTaken when another key has its id (the caller draws another id)."""
        try:
            with self._tx() as s:
                s.add(ApiKeyRow(id=key.id, name=key.name, sha256=key.sha256, models=list(key.models), rpm=key.rpm,
                                tpm=key.tpm, priority=key.priority, created_at=key.created_at,
                                disabled=key.disabled))
        except sa.exc.IntegrityError:
            with self._session() as s:
                if s.get(ApiKeyRow, key.id) is None:
                    raise
            raise KeyIdTaken(f"key id {key.id} is taken") from None
        return key

    def list_keys(self) -> list[StoredKey]:
        with self._session() as s:
            rows = s.scalars(sa.select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id))
            return [_key_from_row(r) for r in rows]

    def delete_key(self, key_id: str) -> bool:
        with self._tx() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return False
            s.delete(row)
            return True

    def set_key_disabled(self, key_id: str, disabled: bool) -> StoredKey | None:
        """Disables or enables a key; the key as it is now, or None when no such key exists."""
        with self._tx() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return None
            row.disabled = disabled
            return _key_from_row(row)

    def touch_keys(self, used: Mapping[str, float]) -> None:
        """Records when keys were last used; a time older than the one stored changes nothing, so reports
        from several routers, arriving in any order, leave the newest."""
        with self._tx() as s:
            for key_id, at in used.items():
                row = s.get(ApiKeyRow, key_id)
                if row is not None and at > (row.last_used_at or 0.0):
                    row.last_used_at = at

    # -- bootstrap tokens and users (llmgw init, llmgw token create) --------------------
    def add_token(self, token: StoredToken) -> None:
        with self._tx() as s:
            s.add(TokenRow(id=token.id, sha256=token.sha256, node_name=token.node_name,
                           expires_at=token.expires_at, uses_left=token.uses_left, created_at=token.created_at))

    def get_token(self, token_id: str) -> StoredToken | None:
        with self._session() as s:
            r = s.get(TokenRow, token_id)
            return None if r is None else StoredToken(r.id, r.sha256, r.node_name, r.expires_at, r.uses_left,
                                                      r.created_at)

    def spend_token(self, token_id: str, *, now: float) -> bool:
        """Takes one use of a token that is unexpired and has one left; False when it had none.

        One conditional UPDATE, so two joins racing for a token's last use cannot both get it.
        """
        with self._tx() as s:
            done = s.execute(sa.update(TokenRow).where(TokenRow.id == token_id, TokenRow.uses_left > 0,
                                                       TokenRow.expires_at > now)
                             .values(uses_left=TokenRow.uses_left - 1))
            return bool(done.rowcount)

    def put_user(self, user: StoredUser) -> None:
        """Creates or replaces a user (its role and password hash)."""
        with self._tx() as s:
            row = s.get(UserRow, user.name)
            if row is None:
                s.add(UserRow(name=user.name, role=user.role, password_hash=user.password_hash,
                              created_at=user.created_at))
            else:
                row.role, row.password_hash = user.role, user.password_hash

    def get_user(self, name: str) -> StoredUser | None:
        with self._session() as s:
            r = s.get(UserRow, name)
            return None if r is None else StoredUser(r.name, r.role, r.password_hash, r.created_at)

    def list_users(self) -> list[StoredUser]:
        with self._session() as s:
            return [StoredUser(r.name, r.role, r.password_hash, r.created_at)
                    for r in s.scalars(sa.select(UserRow).order_by(UserRow.name))]

    def delete_user(self, name: str) -> bool:
        """Deletes a user and every token and session of theirs, in one transaction."""
        with self._tx() as s:
            row = s.get(UserRow, name)
            if row is None:
                return False
            s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.subject == name,
                                                   ApiTokenRow.kind.in_(("user", "session"))))
            s.delete(row)
            return True

    # -- REST credentials (control.auth) -------------------------------------------------
    def add_api_token(self, token: StoredApiToken) -> None:
        with self._tx() as s:
            s.add(ApiTokenRow(id=token.id, sha256=token.sha256, kind=token.kind, subject=token.subject,
                              label=token.label, created_at=token.created_at, expires_at=token.expires_at,
                              last_used_at=token.last_used_at))

    def get_api_token(self, token_id: str) -> StoredApiToken | None:
        with self._session() as s:
            r = s.get(ApiTokenRow, token_id)
            return None if r is None else _api_token(r)

    def list_api_tokens(self, *, kind: str | None = None, subject: str | None = None) -> list[StoredApiToken]:
        q = sa.select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.id)
        if kind is not None:
            q = q.where(ApiTokenRow.kind == kind)
        if subject is not None:
            q = q.where(ApiTokenRow.subject == subject)
        with self._session() as s:
            return [_api_token(r) for r in s.scalars(q)]

    def delete_api_token(self, token_id: str) -> bool:
        with self._tx() as s:
            return bool(s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.id == token_id)).rowcount)

    def delete_api_tokens(self, *, subject: str, kinds: Iterable[str]) -> int:
        """Deletes a subject's tokens of these kinds (a user's sessions at logout, a router's at removal)."""
        with self._tx() as s:
            return int(s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.subject == subject,
                                                              ApiTokenRow.kind.in_(tuple(kinds)))).rowcount)

    def touch_api_token(self, token_id: str, *, at: float) -> None:
        # Unfenced: a usage stamp that a standby authenticating a router's poll may make too.
        with self._session.begin() as s:
            s.execute(sa.update(ApiTokenRow).where(ApiTokenRow.id == token_id).values(last_used_at=at))

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


    # -- engine wants and cluster settings (issue 14) -------------------------------------
    def list_engine_wants(self) -> list[ScopedWant]:
        q = sa.select(EngineWantRow).order_by(EngineWantRow.scope, EngineWantRow.engine, EngineWantRow.version)
        with self._session() as s:
            return [ScopedWant(r.scope, r.engine, r.version, r.created_at) for r in s.scalars(q)]

    def add_engine_want(self, want: ScopedWant) -> bool:
        """Stores a want; False when it was already there (nothing changes then)."""
        with self._tx() as s:
            if s.get(EngineWantRow, (want.scope, want.engine, want.version)) is not None:
                return False
            s.add(EngineWantRow(scope=want.scope, engine=want.engine, version=want.version,
                                created_at=want.created_at))
            return True

    def delete_engine_want(self, scope: str, engine: str, version: str) -> bool:
        with self._tx() as s:
            return bool(s.execute(sa.delete(EngineWantRow).where(
                EngineWantRow.scope == scope, EngineWantRow.engine == engine,
                EngineWantRow.version == version)).rowcount)

    def settings(self) -> dict[str, str]:
        with self._session() as s:
            return {r.key: r.value for r in s.scalars(sa.select(SettingRow))}

    def put_settings(self, values: dict[str, str]) -> None:
        with self._tx() as s:
            for key, value in values.items():
                s.merge(SettingRow(key=key, value=value))

    # -- the autoscaler's state (issue 17) ---------------------------------------------------
    def autoscale_states(self) -> dict[str, StoredAutoscale]:
        """Every autoscaled model's stored state, by model name."""
        with self._session() as s:
            return {r.model: StoredAutoscale(r.model, r.replicas, r.above_since, r.below_since, r.idle_since,
                                             r.last_scale_up_at, r.last_change_at, r.last_reason or "")
                    for r in s.scalars(sa.select(AutoscaleRow))}

    def write_autoscale(self, *, upserts: Iterable[StoredAutoscale] = (), deletes: Iterable[str] = ()) -> None:
        """Writes autoscaler states in one fenced transaction (only the leader scales)."""
        with self._tx() as s:
            for a in upserts:
                row = s.get(AutoscaleRow, a.model)
                if row is None:
                    row = AutoscaleRow(model=a.model)
                    s.add(row)
                row.replicas, row.above_since, row.below_since = a.replicas, a.above_since, a.below_since
                row.idle_since, row.last_scale_up_at = a.idle_since, a.last_scale_up_at
                row.last_change_at, row.last_reason = a.last_change_at, _text(a.last_reason)
            for name in deletes:
                row = s.get(AutoscaleRow, name)
                if row is not None:
                    s.delete(row)

    # -- the leader lease (issue 15) -----------------------------------------------------
    # Every change is one conditional statement, so two servers racing cannot both win on SQLite or on
    # PostgreSQL, without SELECT ... FOR UPDATE (which SQLite lacks): the WHERE clause is the check. None
    # of these is fenced: they are how the fence moves.
    def get_lease(self, name: str = "leader") -> Lease | None:
        with self._session() as s:
            r = s.get(LeaseRow, name)
            return None if r is None else Lease(r.holder, r.term, r.expires_at, r.renewed_at, r.address)

    def take_lease(self, holder: str, *, now: float, lease_s: float, address: str = "", term: int = 0,
                   name: str = "leader") -> Lease | None:
        """Renews the lease (``term`` given: only if ``holder`` still holds it at that term) or takes it
        (``term`` 0: when nobody holds it, it expired, or ``holder`` itself held it before a restart; the term
        goes up by one, so every taking is a new fencing token). None when refused.

        ``now`` is the database's clock (``db_now``) for every server, so expiry never compares two
        machines' clocks.
        """
        if term:
            with self._session.begin() as s:
                renewed = s.execute(sa.update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder,
                                                              LeaseRow.term == term)
                                    .values(expires_at=now + lease_s, renewed_at=now, address=address)).rowcount
            return self.get_lease(name) if renewed else None
        current = self.get_lease(name)
        if current is None:
            try:
                with self._session.begin() as s:
                    s.add(LeaseRow(name=name, holder=holder, term=1, expires_at=now + lease_s, renewed_at=now,
                                   address=address))
            except sa.exc.IntegrityError:  # another server made the row first: it holds the lease
                return None
        elif current.expires_at > now and current.holder != holder:
            return None
        else:
            with self._session.begin() as s:
                # The term seen is part of the condition: of two servers taking one expired lease, the
                # second finds the term moved on and takes nothing.
                took = s.execute(sa.update(LeaseRow).where(LeaseRow.name == name, LeaseRow.term == current.term,
                                                           LeaseRow.holder == current.holder)
                                 .values(holder=holder, term=current.term + 1, expires_at=now + lease_s,
                                         renewed_at=now, address=address)).rowcount
            if not took:
                return None
        lease = self.get_lease(name)
        return lease if lease is not None and lease.holder == holder else None

    def release_lease(self, holder: str, *, term: int, now: float, name: str = "leader") -> bool:
        """Ends the holder's lease at once (a clean stop), so a standby takes over without waiting it out."""
        with self._session.begin() as s:
            return bool(s.execute(sa.update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder,
                                                            LeaseRow.term == term)
                                  .values(expires_at=now)).rowcount)

    # -- control plane instances (llmgw get controlplanes) ---------------------------------
    def beat_controlplane(self, cp: StoredControlPlane) -> None:
        """Creates or refreshes an instance's row (unfenced: a standby says it is alive too)."""
        with self._session.begin() as s:
            row = s.get(ControlPlaneRow, cp.id)
            if row is None:
                row = ControlPlaneRow(id=cp.id, started_at=cp.started_at)
                s.add(row)
            row.http_url, row.agent_addr = cp.http_url[:320], cp.agent_addr[:320]
            row.version, row.started_at, row.last_seen = cp.version[:64], cp.started_at, cp.last_seen

    def list_controlplanes(self) -> list[StoredControlPlane]:
        with self._session() as s:
            return [StoredControlPlane(r.id, r.http_url, r.agent_addr, r.version, r.started_at, r.last_seen)
                    for r in s.scalars(sa.select(ControlPlaneRow).order_by(ControlPlaneRow.id))]

    def forget_controlplanes(self, *, unseen_since: float) -> int:
        """Drops instances silent since before ``unseen_since`` (stopped for good); returns how many."""
        with self._session.begin() as s:
            return int(s.execute(sa.delete(ControlPlaneRow).where(ControlPlaneRow.last_seen < unseen_since))
                       .rowcount)

    # -- the audit log -----------------------------------------------------------------
    def record_audit(self, *, actor: str, action: str, object: str, outcome: str, detail: str = "",
                     at: float | None = None) -> AuditEntry:
        """Appends one action to the audit log; returns it with its id. Kept for the retention (``prune_audit``)."""
        if outcome not in AUDIT_OUTCOMES:
            raise ValueError(f"audit outcome {outcome!r}: expected one of {', '.join(AUDIT_OUTCOMES)}")
        row = AuditRow(at=time.time() if at is None else at, actor=actor[:320], action=action[:32],
                       object=object[:320], outcome=outcome, detail=_text(detail[:2000]))
        with self._tx() as s:
            s.add(row)
            s.flush()
            return AuditEntry(row.id, row.at, row.actor, row.action, row.object, row.outcome, row.detail)

    def set_audit_detail(self, entry_id: int, detail: str) -> None:
        """Rewrites one entry's detail: a row that counts refusals (``http.audit.RefusalCounts``) as they come."""
        with self._tx() as s:
            s.execute(sa.update(AuditRow).where(AuditRow.id == entry_id).values(detail=_text(detail[:2000])))

    def prune_audit(self, *, before: float) -> int:
        """Deletes the entries older than ``before`` (the retention, ``llmgw server --audit-retention``)."""
        with self._tx() as s:
            return int(s.execute(sa.delete(AuditRow).where(AuditRow.at < before)).rowcount)

    def list_audit(self, *, since_id: int = 0, limit: int = 500) -> list[AuditEntry]:
        """Up to ``limit`` entries after ``since_id``, oldest first (``since_id=0``: from the start)."""
        q = (sa.select(AuditRow.id, AuditRow.at, AuditRow.actor, AuditRow.action, AuditRow.object,
                       AuditRow.outcome, AuditRow.detail)
             .where(AuditRow.id > since_id).order_by(AuditRow.id).limit(limit))
        with self._session() as s:
            return [AuditEntry(*r) for r in s.execute(q).all()]


def _api_token(r: ApiTokenRow) -> StoredApiToken:
    return StoredApiToken(r.id, r.sha256, r.kind, r.subject, r.created_at, r.expires_at, r.last_used_at, r.label)


def _conds(docs: Any) -> tuple[Condition, ...]:
    return tuple(Condition.from_doc(d) for d in (docs or ()))


def _event(r: EventRow) -> Event:
    return Event(time=r.time, kind=r.kind, reason=r.reason, object=r.object, message=r.message, model=r.model,
                 node=r.node, id=r.id)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the CLI and tests read while the server writes; without it a
    # reader during a write gets "database is locked".
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()
