"""The control plane's REST API (``/api/v1``), the one the CLI and admin UI use: assembled here from one
module per resource (models, nodes, replicas, routers, meta, keys, users, ...).

Bodies are model manifests as JSON (the CLI turns YAML into this). Every refusal is OpenAI-shaped JSON
naming the bad field, never a stack trace (``apierrors``); every JSON answer is described by its
response model (``schemas``) in ``/api/openapi.json``, whose copy is ``docs/openapi.json`` (``openapi``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from llmgw.control.auth import Auth
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.batches.service import BatchService
from llmgw.control.catalog import entries as catalog_entries
from llmgw.control.cluster import Cluster
from llmgw.control.http import (
    adapters,
    apidocs,
    ca,
    engines,
    events,
    fabric,
    keys,
    login,
    meta,
    metrics,
    models,
    nodecerts,
    nodes,
    nodeupgrade,
    preview,
    priorities,
    projects,
    replicas,
    routerbatches,
    routercreds,
    routers,
    routertokenizer,
    routerusage,
    settings,
    sso,
    tokens,
    users,
    weights,
)
from llmgw.control.http import audit as audit_http
from llmgw.control.http import forward as forward_http
from llmgw.control.http import history as history_http
from llmgw.control.http import usage as usage_http
from llmgw.control.http.errors import REFUSALS, install
from llmgw.control.routerreports import RouterEvents
from llmgw.control.sso import SsoService
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.control.usage.service import UsageService


def create_api(store: Store | StoreThread, cluster: Cluster, *, auth: Auth, extra_registries: tuple[Any, ...] = (),
               router_events: RouterEvents | None = None, leadership: forward_http.View | None = None,
               join: tokens.JoinPoint | None = None, usage: UsageService | None = None,
               sso_service: SsoService | None = None, cluster_ca: bytes | None = None,
               cert_files: Mapping[str, Path] | None = None,
               catalog: tuple[catalog_entries.Entry, ...] | None = None,
               batches: BatchService | None = None) -> FastAPI:
    """The REST app; ``extra_registries`` (the in-process router's) are served on the same /metrics.

    Every store call is awaited on the store's thread (``store.offloop``), never made on the
    event loop; a plain ``Store`` is given one. ``router_events`` holds what routers report
    (the in-process router's callback writes to the same one); a fresh one when not given.
    ``auth`` decides who may call what (``Auth.insecure()``: everyone, everything); it is a required
    keyword so that no caller gets an open API by leaving it out. ``leadership`` (``leader.Leadership``)
    is what ``/api/v1/controlplanes`` lists; None (a single server): an empty list. ``join``: where agents
    join this server, for the command ``POST /api/v1/tokens`` answers; None: no join port (``--insecure``).
    ``usage``: what answers routers' usage and quota documents (the server's, which its in-process router
    shares); a fresh one over ``store`` when not given. ``sso_service``: single sign-on (``control.sso``);
    None: not configured (``/api/v1/sso`` says so). ``cluster_ca``: the cluster CA's certificate (PEM),
    served unauthenticated at ``/api/v1/ca`` for clients to pin; None (``--insecure``): those answer 404.
    ``cert_files``: the certificates (name -> PEM file) whose expiry ``/metrics`` exports.
    ``catalog``: the models ``/api/v1/catalog`` lists (``--catalog``); None: the shipped catalog.
    ``batches``: what answers routers' batch claims and results (issue 32); a fresh one over ``store`` if not given.
    """
    reports = router_events if router_events is not None else RouterEvents()
    app = FastAPI(title="llmgw control plane", version="v1", docs_url=None, redoc_url=None,
                  openapi_url=apidocs.OPENAPI_PATH)
    install(app)
    apidocs.install(app)  # /api/docs without Swagger UI's CDN assets
    db = store if isinstance(store, StoreThread) else StoreThread(store)
    app.state.sso = sso_service  # the UI's sign-in button asks it (None: not configured)
    # Nothing inside the auth middleware runs for a request without the credential it needs; it puts
    # the principal it proved in the scope, refused or not.
    app.add_middleware(auth_mw.AuthMiddleware, auth=auth)
    # Every mutating route recorded in one place (audit_http.AUDITED), never per handler. Added last,
    # so outermost: a change a user's role refuses (403) is recorded with who tried it.
    app.add_middleware(audit_http.AuditMiddleware, db=db)
    for part in (login.router(auth), sso.router(sso_service), users.router(db, auth),
                 routercreds.router(db, auth), audit_http.router(db),
                 keys.router(db, cluster), nodecerts.router(db, cluster), tokens.router(db, join),
                 events.router(db), weights.router(db, cluster), fabric.router(cluster),
                 engines.router(db, cluster), settings.router(db), meta.router(leadership),
                 models.router(db, cluster), adapters.router(db, cluster), replicas.router(db, cluster, reports),
                 routers.router(cluster, reports),
                 nodes.router(db, cluster), nodeupgrade.router(db, cluster), history_http.router(cluster),
                 projects.router(db, cluster), routertokenizer.router(db, cluster),
                 priorities.router(db, cluster),
                 routerusage.router(usage or UsageService(db)), ca.router(cluster_ca),
                 preview.router(db, cluster, catalog if catalog is not None else catalog_entries.load())):
        app.include_router(part, responses=REFUSALS)
    app.include_router(usage_http.router(db), responses=REFUSALS)
    app.include_router(routerbatches.router(batches or BatchService(db)), responses=REFUSALS)
    # Text, and refuses nothing itself.
    app.include_router(metrics.router(db, cluster, reports, extra_registries, cert_files))
    return app
