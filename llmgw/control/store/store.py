"""The store: the only place that speaks SQL, assembled from one part per concern.

SQLite by default, in the data directory; the schema is created and upgraded
by Alembic migrations at open, so a second ``llmgw server`` on an older data
directory upgrades it instead of failing on a missing column. Callers get and
give ``llmgw.core``/``llmgw.control.state`` objects, never rows.

``Store`` is the one object callers hold; each concern is a mixin in its own module, all writing
through the fenced transaction of ``base.StoreBase``:

- ``base``: the URL, the engine, the fence, the migrations;
- ``workloads``: models, replicas and their conditions;
- ``nodes``: nodes and their certificates;
- ``credentials``: API keys, bootstrap tokens, users, REST tokens;
- ``projects``: projects, their members and limits (issue 26);
- ``history``: events and the audit log;
- ``leadership``: the leader lease and the control plane instances;
- ``clusterwide``: engine wants, settings, the autoscaler's state;
- ``usagequery``: usage read from the rollups, and who belongs to which project.
- ``usage``: routers' usage rollups, applied once per record;
- ``quotas``: the quota ledger and routers' leases;
- ``sso``: single sign-on's pending flows and its users' links (issue 28);
- ``batches``: OpenAI files, batches and their lines (issue 32).

The records and errors are importable from here, where callers have always found them.
"""

from __future__ import annotations

from llmgw.control.store.base import (
    MIGRATION_LOCK_KEY,
    MIGRATIONS,
    STANDBY,
    URL_SCHEMES,
    Fenced,
    StoreBase,
    StoreUnreachable,
    StoreUrlRefused,
    check_url,
    sqlite_url,
    unreachable,
)
from llmgw.control.store.batches import BatchStore
from llmgw.control.store.clusterwide import ClusterwideStore, StoredAutoscale
from llmgw.control.store.credentials import (
    CredentialStore,
    KeyIdTaken,
    StoredApiToken,
    StoredKey,
    StoredToken,
    StoredUser,
)
from llmgw.control.store.history import AUDIT_OUTCOMES, EVENTS_KEPT, AuditEntry, HistoryStore
from llmgw.control.store.leadership import LeadershipStore, Lease, StoredControlPlane
from llmgw.control.store.nodes import NodeStore, StoredNode, StoredNodeCert
from llmgw.control.store.projects import ProjectRefused, ProjectStore, StoredProject, UnknownProject
from llmgw.control.store.quotas import QuotaStore
from llmgw.control.store.sso import SsoNameTaken, SsoStore, StoredSsoLink
from llmgw.control.store.usage import UsageStore
from llmgw.control.store.usagequery import UsageQueryStore
from llmgw.control.store.workloads import StoredModel, WorkloadStore

__all__ = [
    "AUDIT_OUTCOMES", "EVENTS_KEPT", "MIGRATIONS", "MIGRATION_LOCK_KEY", "STANDBY", "URL_SCHEMES",
    "AuditEntry", "Fenced", "KeyIdTaken", "Lease", "Store", "StoreUnreachable", "StoreUrlRefused",
    "StoredApiToken", "StoredAutoscale", "StoredControlPlane", "StoredKey", "StoredModel", "StoredNode",
    "StoredNodeCert", "StoredToken", "StoredUser", "check_url",
    "ProjectRefused", "SsoNameTaken", "StoredProject", "StoredSsoLink", "UnknownProject", "sqlite_url", "unreachable",
]


class Store(WorkloadStore, NodeStore, CredentialStore, ProjectStore, HistoryStore, LeadershipStore,
            ClusterwideStore, UsageStore, QuotaStore, UsageQueryStore, SsoStore, BatchStore, StoreBase):
    """The cluster's state in SQLite or PostgreSQL: open with ``Store.open``/``Store.open_url``.

    ``fence`` (``StoreBase``) guards every write of the cluster's state; see ``base.StoreBase._tx``.
    """
