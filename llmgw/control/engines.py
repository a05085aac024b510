"""Engine wants and settings: the one owner of the ``engine_wants`` and ``settings`` rows and the cluster's copies.

An operator's want (``llmgw engine install``) is written to the store first, then
rebound on the cluster (``Cluster.engine_wants``), whose next pass works out each
node's whole Provision (``reconcile.engines.provision_for``) and sends it where
it changed. A removal (``llmgw engine remove``) is decided here and sent at once
as a one-off Provision with ``remove``: refused while a replica may run the
version, or while something would only install it again.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

from llmgw.control.cluster import Cluster
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.core import engines as engine_facts
from llmgw.core.provision import EngineInstall, EngineWant

log = logging.getLogger(__name__)
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!-]{0,62}")


class EngineRefused(Exception):
    """A want or a removal refused as asked; the message says why and what to do instead."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclasses.dataclass(frozen=True, slots=True)
class Removal:
    """What ``remove`` did: the nodes told to remove, and the ones that were not connected."""

    sent: tuple[str, ...]
    not_connected: tuple[str, ...]


def settings_with_flags(stored: provisioning.EngineSettings, *, index_url: str | None = None,
                        find_links: bool | None = None,
                        models_trigger_installs: bool | None = None,
                        os_packages: bool | None = None) -> provisioning.EngineSettings:
    """The stored settings with each server flag that was given in its place (a flag given wins, and is stored)."""
    changes: dict[str, Any] = {}
    if index_url is not None:
        changes["index_url"] = index_url
    if find_links is not None:
        changes["find_links"] = find_links
    if models_trigger_installs is not None:
        changes["models_trigger_installs"] = models_trigger_installs
    if os_packages is not None:
        changes["os_packages"] = os_packages
    return dataclasses.replace(stored, **changes)


def apply_server_flags(store: Store, cluster: Cluster, **flags: Any) -> provisioning.EngineSettings:
    """At start, before anything listens: writes the flags given over the stored settings; returns the result."""
    settings = settings_with_flags(provisioning.EngineSettings.from_map(store.settings()), **flags)
    store.put_settings(settings.to_map())
    cluster.engine_settings = settings
    log.info("engine installs: index %s%s; models %s trigger installs", settings.index_url or "(none configured)",
             " (a find-links page)" if settings.find_links else "",
             "may" if settings.models_trigger_installs else "may not")
    return settings


def _check(engine: str, version: str, node: str, pool: str, cluster: Cluster | None) -> str:
    if engine not in engine_facts.KNOWN_ENGINES:
        raise EngineRefused(f"engine {engine!r} is not one llmgw runs; choose one of "
                            f"{', '.join(sorted(engine_facts.KNOWN_ENGINES))}", code="unknown_engine")
    if not _VERSION.fullmatch(version):
        raise EngineRefused(f"version {version!r} is not a version such as 0.11.2; give the exact version to install",
                            code="invalid_version")
    if bool(node) == bool(pool):
        raise EngineRefused("name either a node or a pool (--pool P), not both and not neither", code="invalid_scope")
    if node and cluster is not None and node not in cluster.nodes:
        raise EngineRefused(f"node {node!r} is not known; `llmgw get nodes` lists them", status=404,
                            code="not_found")
    return provisioning.scope_of(node=node, pool=pool)


def _nodes_in(scope: str, cluster: Cluster) -> list[str]:
    if scope.startswith(provisioning.NODE_SCOPE):
        return [scope[len(provisioning.NODE_SCOPE):]]
    pool = scope[len(provisioning.POOL_SCOPE):]
    return sorted(n.id for n in cluster.nodes.values() if n.labels.get("pool") == pool)


async def install(db: StoreThread, cluster: Cluster, engine: str, version: str, *, node: str = "",
                  pool: str = "") -> tuple[provisioning.ScopedWant, bool]:
    """Stores the want and lets the next pass send it; returns it and whether it is new."""
    scope = _check(engine, version, node, pool, cluster)
    want = provisioning.ScopedWant(scope, engine, version, cluster.clock())
    added = await db.call(db.store.add_engine_want, want)
    if added:
        cluster.engine_wants = tuple(sorted({*cluster.engine_wants, want}))
        cluster.kick()
    return want, added


async def forget(db: StoreThread, cluster: Cluster, engine: str, version: str, *, node: str = "",
                 pool: str = "") -> bool:
    """Deletes the want (the install stays: ``remove`` removes it); False when there was none."""
    scope = _check(engine, version, node, pool, None)  # a node gone since may still have its want deleted
    gone = await db.call(db.store.delete_engine_want, scope, engine, version)
    if gone:
        cluster.engine_wants = tuple(w for w in cluster.engine_wants if (w.scope, w.engine, w.version) !=
                                     (scope, engine, version))
        cluster.kick()
    return bool(gone)


async def remove(db: StoreThread, cluster: Cluster, engine: str, version: str, *, node: str = "",
                 pool: str = "") -> Removal:
    """Drops the scope's want and tells its nodes to remove the install, unless something still needs it there."""
    scope = _check(engine, version, node, pool, cluster)
    want = EngineWant(engine, version)
    nodes = _nodes_in(scope, cluster)
    if not nodes:
        raise EngineRefused(f"no node is in pool {pool!r}; `llmgw get nodes -o wide` shows each node's pool",
                            status=404, code="not_found")
    models = {m.model.name: m.model.spec for m in await db.list_models()}
    users = provisioning.users_of(want, nodes, await db.list_replicas(), models)
    if users:
        raise EngineRefused(f"{engine} {version} may be in use by replica {', '.join(users)} on "
                            f"{'pool ' + pool if pool else node}: delete their models, or drain the node, "
                            "before removing it", status=409, code="in_use")
    left = tuple(w for w in cluster.engine_wants
                 if not (w.scope == scope and w.engine == engine and w.version == version))
    for node_id in nodes:
        view = cluster.nodes[node_id]
        if want in provisioning.provision_for(view, left, models, cluster.engine_settings).wants:
            raise EngineRefused(_kept_by(want, view, left, models), status=409, code="still_wanted")
    await db.call(db.store.delete_engine_want, scope, engine, version)
    cluster.engine_wants = left
    sent, absent = [], []
    for node_id in nodes:
        # The node's whole Provision as it is now, without the want: one sent with the want still
        # listed (the last one sent, as first written) asked the agent to remove and keep it at once.
        base = provisioning.provision_for(cluster.nodes[node_id], left, models, cluster.engine_settings)
        ok = cluster.send_engine_removal(node_id, dataclasses.replace(base, remove=(want,)))
        (sent if ok else absent).append(node_id)
    cluster.kick()
    return Removal(tuple(sent), tuple(absent))


def _kept_by(want: EngineWant, view: Any, left: tuple[provisioning.ScopedWant, ...],
             models: dict[str, Any]) -> str:
    """Why ``want`` would be installed again on the node: another scope's want, or a model's engine_version."""
    for w in left:
        if w.want == want and w.applies_to(view):
            kind, name = w.scope.split(":", 1)
            flag = f"--pool {name}" if kind == "pool" else name
            return (f"{want} is wanted on {view.id} by its {kind} {name}'s want, and would be installed again; "
                    f"remove it there with `llmgw engine remove {flag} {want.engine} {want.version}`")
    asking = sorted(n for n, s in models.items() if s.engine == want.engine and s.engine_version
                    and EngineWant(s.engine, s.engine_version) == want)
    return (f"{want} is asked for by model {', '.join(asking) or '?'} (its engine_version) and would be installed "
            f"again on {view.id}: change or delete the model, or start the server with --no-model-installs")


def install_doc(i: EngineInstall) -> dict[str, Any]:
    return {"engine": i.engine, "version": i.version, "variant": i.variant, "state": i.state.value,
            "message": i.message, "bytes_done": i.bytes_done, "bytes_total": i.bytes_total,
            "last_output": list(i.last_output), "path": i.path, "checked_unix": i.checked_unix,
            "retry_unix": i.retry_unix, "missing_os_packages": list(i.missing_os_packages),
            "os_install_command": i.os_install_command}


def engines_doc(cluster: Cluster) -> dict[str, Any]:
    """The body of ``GET /api/v1/engines``: the wants, the settings, and each node's installs and wants."""
    s = cluster.engine_settings
    nodes = []
    for view in sorted(cluster.nodes.values(), key=lambda v: v.id):
        sent = cluster.provisioned(view.id)
        nodes.append({"node": view.id, "pool": view.labels.get("pool", ""), "connected": view.connected,
                      "wanted": [str(w) for w in sent.wants] if sent else [],
                      "engines": [f"{n} {v}" for n, v in view.inventory.engines],
                      "installs": [install_doc(i) for i in view.inventory.installs]})
    return {"wants": [{"scope": w.scope, "engine": w.engine, "version": w.version, "created_at": w.created_at}
                      for w in cluster.engine_wants],
            "settings": {"index_url": s.index_url, "find_links": s.find_links,
                         "models_trigger_installs": s.models_trigger_installs, "os_packages": s.os_packages},
            "nodes": nodes}
