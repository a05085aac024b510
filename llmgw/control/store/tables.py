"""The database schema, as SQLAlchemy 2 declarative tables.

Only desired state and the control plane's own targets are stored: what a
replica should be doing and where. What nodes report (memory, shard states)
lives in memory and arrives again on every reconnect, so a lost heartbeat never
needs a write and a restart never trusts a stale observation.

The usage and budget tables (issue 26) are in ``usagetables``, on this ``Base``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class ModelRow(Base):
    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    #: The canonical manifest (``Model.to_manifest()``), so reading it back
    #: goes through the same validation as a file.
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    #: ``Condition.to_doc()`` each; kept so a transition time survives a restart.
    conditions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)


class NodeRow(Base):
    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(253), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(253), default="")
    mgmt_addr: Mapped[str] = mapped_column(String(253), default="")
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    #: The inventory from the last registration, for listing a node that is
    #: not connected now.
    inventory: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    #: `llmgw cordon`: nothing new is placed here. Stored, so a restart does not undo it.
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    #: `llmgw drain`: its replicas move elsewhere (cordoned is set too).
    draining: Mapped[bool] = mapped_column(Boolean, default=False)


class ReplicaRow(Base):
    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: No foreign key: a deleted model's replicas stay until their shards have stopped.
    model: Mapped[str] = mapped_column(String(63), index=True)
    #: The spec fingerprint this replica runs; differs from the model's after an edit.
    fingerprint: Mapped[str] = mapped_column(String(32))
    phase: Mapped[str] = mapped_column(String(16))
    node_id: Mapped[str | None] = mapped_column(String(253), nullable=True)
    shard_id: Mapped[str | None] = mapped_column(String(96), nullable=True)
    api_key: Mapped[str] = mapped_column(String(96))
    #: Launches so far; the shard id is ``{id}-{attempt}``.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    #: Failures in a row, for backoff; reset when the replica is Ready.
    failures: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float, default=0.0)
    started_at: Mapped[float] = mapped_column(Float, default=0.0)
    sent_at: Mapped[float] = mapped_column(Float, default=0.0)
    ready_at: Mapped[float] = mapped_column(Float, default=0.0)
    endpoint: Mapped[str] = mapped_column(String(253), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    last_output: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    #: GPU indices on its node that placement gave it.
    gpus: Mapped[list[int]] = mapped_column(JSON, default=list)
    #: Memory it was placed with (per GPU for a GPU replica); 64-bit: 80 GiB does not fit 32.
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    #: A multi-node replica's ranks, leader first: {rank, node_id, shard_id, gpus, hcas} each;
    #: empty for a one-node replica. Persisted, so a restarted control plane still knows
    #: every shard of the group and neither stops them as orphans nor loses track of one.
    members: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    leader_addr: Mapped[str] = mapped_column(String(253), default="")
    leader_port: Mapped[int] = mapped_column(Integer, default=0)
    #: ``Condition.to_doc()`` each, written apart from the target (``Store.set_conditions``).
    conditions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    #: sha256 hex of the secret; the secret itself is never stored, so a copied
    #: database file cannot be used to call the API.
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    #: Model names the key may use; empty means every model.
    models: Mapped[list[str]] = mapped_column(JSON, default=list)
    rpm: Mapped[int] = mapped_column(Integer, default=0)  # 0: unlimited
    tpm: Mapped[int] = mapped_column(Integer, default=0)  # 0: unlimited
    priority: Mapped[int] = mapped_column(Integer, default=0)  # higher is admitted first
    created_at: Mapped[float] = mapped_column(Float)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    #: When the key last called the OpenAI API, as routers reported it; 0: never. Written at most every
    #: few seconds per key (``control.keyuse``), not per request: a busy key would otherwise be a write
    #: a request.
    last_used_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    #: The project the key belongs to (issue 26); keys made before projects moved to ``default``.
    project: Mapped[str] = mapped_column(String(63), default="default", server_default="default")
    #: The user the key was made for ("" : the project's, no one's in particular).
    user: Mapped[str] = mapped_column(String(63), default="", server_default="")
    #: The key's budgets and quotas (``core.quota.Limits.to_doc()``); {}: none beyond rpm/tpm.
    limits: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class EventRow(Base):
    __tablename__ = "events"

    #: Increasing: ``llmgw events -f`` asks for those after the last it saw.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64))
    object: Mapped[str] = mapped_column(String(320), index=True)
    model: Mapped[str] = mapped_column(String(63), index=True, default="")
    node: Mapped[str] = mapped_column(String(253), index=True, default="")
    message: Mapped[str] = mapped_column(Text, default="")


class TokenRow(Base):
    """A bootstrap token for `llmgw agent join`, kubeadm-style ``ID.SECRET``."""

    __tablename__ = "bootstrap_tokens"

    #: The token's public half: it finds the row, so a check hashes one secret, not every row's.
    id: Mapped[str] = mapped_column(String(6), primary_key=True)
    #: sha256 hex of the secret half (16 of [a-z0-9], 82 random bits: a slow hash buys nothing); never the secret.
    sha256: Mapped[str] = mapped_column(String(64))
    #: The node id a join with this token gets; empty: the one the agent asks for.
    node_name: Mapped[str] = mapped_column(String(253), default="")
    expires_at: Mapped[float] = mapped_column(Float)
    uses_left: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class UserRow(Base):
    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    #: argon2id (argon2-cffi's encoded form, salt and parameters included); never the password.
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)
    #: "local" (a password), or "sso" (made and updated by single sign-on; no password: ``control.sso``).
    source: Mapped[str] = mapped_column(String(16), default="local", server_default="local")


class AuditRow(Base):
    """One mutating action: who, when, on what, and how it ended (``llmgw audit``)."""

    __tablename__ = "audit"

    #: Increasing: ``llmgw audit -f`` asks for those after the last it saw.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    #: Who: the CLI's claimed user and the peer's address until authentication lands.
    actor: Mapped[str] = mapped_column(String(320))
    action: Mapped[str] = mapped_column(String(32))
    object: Mapped[str] = mapped_column(String(320))
    #: ok, refused (4xx) or failed (5xx).
    outcome: Mapped[str] = mapped_column(String(16))
    #: Why it was refused or failed; never a secret or a request body.
    detail: Mapped[str] = mapped_column(Text, default="")


class ApiTokenRow(Base):
    """A credential for the REST API: a user's CLI token or UI session, or a router's (``control.auth``)."""

    __tablename__ = "api_tokens"

    #: The token's public half: it finds the row.
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    #: sha256 hex of the secret half (32 random characters: a slow hash buys nothing); never the secret.
    sha256: Mapped[str] = mapped_column(String(64))
    #: user (a CLI's API token), session (the admin UI's cookie) or router.
    kind: Mapped[str] = mapped_column(String(16))
    #: The user's name, or the router's.
    subject: Mapped[str] = mapped_column(String(63), index=True)
    #: What it is for, shown in lists ("cli on host7"); never a secret.
    label: Mapped[str] = mapped_column(String(120), default="")
    created_at: Mapped[float] = mapped_column(Float)
    #: 0: until deleted.
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_used_at: Mapped[float] = mapped_column(Float, default=0.0)


class NodeCertRow(Base):
    """A node certificate the cluster CA signed: found by serial when its agent connects, refused once revoked."""

    __tablename__ = "node_certs"

    #: The certificate's serial number, lower-case hex.
    serial: Mapped[str] = mapped_column(String(40), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    issued_at: Mapped[float] = mapped_column(Float)
    not_after: Mapped[float] = mapped_column(Float)
    #: 0: not revoked.
    revoked_at: Mapped[float] = mapped_column(Float, default=0.0)


class EngineWantRow(Base):
    """An engine version an operator wants installed on a node or on every node of a pool (issue 14)."""

    __tablename__ = "engine_wants"

    #: "node:<id>" or "pool:<name>".
    scope: Mapped[str] = mapped_column(String(320), primary_key=True)
    engine: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)


class SettingRow(Base):
    """One cluster setting by key (engine_index_url, models_trigger_installs, ...): a value as text."""

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, default="")


class ClusterSettingRow(Base):
    """One spec policy setting (issue 24: ``allowed_env``, ``allow_remote_code``), its value as JSON.

    Apart from ``settings``: those are engine install settings a server's flags overwrite at start.
    """

    __tablename__ = "cluster_settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
    #: Who set it last (a user name); the audit log has every change.
    updated_by: Mapped[str] = mapped_column(String(253), default="")


class LeaseRow(Base):
    """The control plane's leader lease: one row, taken and renewed only by conditional UPDATEs (``Store``)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(253))
    #: The fencing token: +1 at every change of holder, never reused; a deposed leader's writes carry an old one.
    term: Mapped[int] = mapped_column(Integer)
    #: Wall-clock seconds, the database's rows compared with each server's clock (see ``Store.take_lease``).
    expires_at: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[float] = mapped_column(Float)
    #: Where the holder serves (HOST:HTTP_PORT and the agent port): what a standby tells agents and routers.
    address: Mapped[str] = mapped_column(String(320), default="")


class ControlPlaneRow(Base):
    """One control plane instance (``llmgw server``), written by itself every lease renewal period."""

    __tablename__ = "controlplanes"

    #: The instance id: the lease's holder when it leads (kept in its data directory across restarts).
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: Where its REST API answers (http://HOST:PORT): where a standby forwards the API to when it leads.
    http_url: Mapped[str] = mapped_column(String(320), default="")
    #: Where agents reach it (HOST:PORT): what a standby's refusal sends agents to when it leads.
    agent_addr: Mapped[str] = mapped_column(String(320), default="")
    version: Mapped[str] = mapped_column(String(64), default="")
    #: Database-clock seconds (``Store.db_now``), like the lease's.
    started_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class AutoscaleRow(Base):
    """One autoscaled model's autoscaler state (issue 17): the count in force and its windows.

    Stored, so a restarted or new leader neither forgets the count it scaled to (and falls back to
    ``min_replicas``, draining replicas that serve load) nor restarts a window that was about to close.
    """

    __tablename__ = "autoscale"

    #: The model's name; no foreign key: the row goes with the model in the same leader's next pass.
    model: Mapped[str] = mapped_column(String(63), primary_key=True)
    #: The count in force (``core.autoscale.State.replicas``).
    replicas: Mapped[int] = mapped_column(Integer)
    above_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    below_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_scale_up_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_change_at: Mapped[float] = mapped_column(Float, default=0.0)
    #: The sentence of the last change ("3 → 5: queue 9.2 per replica > target 2 for 30s"); "" before one.
    last_reason: Mapped[str] = mapped_column(Text, default="")


class ProjectRow(Base):
    """A team or application sharing the fleet (issue 26): its keys, members and budgets."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    description: Mapped[str] = mapped_column(String(500), default="")
    #: ``core.quota.Limits.to_doc()``; {}: no budget.
    limits: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(253), default="")


class ProjectMemberRow(Base):
    """A user's role in a project: owner, member or viewer (``core.quota.PROJECT_ROLES``)."""

    __tablename__ = "project_members"

    project: Mapped[str] = mapped_column(String(63), primary_key=True)
    user: Mapped[str] = mapped_column(String(63), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))


class SsoPendingRow(Base):
    """A single sign-on begun and not finished: a browser's state (its nonce and PKCE verifier) or a device
    flow's handle (its device code). Taken once; gone after ``expires_at`` (``control.sso``)."""

    __tablename__ = "sso_pending"

    #: sha256 hex of the state or handle: the row is found by what the client holds, which is never stored.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: "code" (a browser's authorization code flow) or "device" (the CLI's device flow).
    kind: Mapped[str] = mapped_column(String(16))
    #: nonce, code_verifier, redirect_uri, or device_code, interval: the flow's own secrets, short-lived.
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class SsoLinkRow(Base):
    """A user single sign-on made: the provider's subject and its refresh token (sealed with a key derived from
    the client secret; never returned), refreshed every ``--sso-refresh-interval``."""

    __tablename__ = "sso_links"

    user: Mapped[str] = mapped_column(String(63), primary_key=True)
    #: ``iss`` and ``sub`` of the provider's account: one account per llmgw user.
    subject: Mapped[str] = mapped_column(String(600))
    refresh_token: Mapped[str] = mapped_column(Text, default="")
    #: The groups the last ID token carried (shown in ``llmgw user list``'s detail; decisions re-read them).
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[float] = mapped_column(Float)
    refreshed_at: Mapped[float] = mapped_column(Float)
