"""The control plane's REST API (``/api/v1``), the one the CLI and admin UI use.

Bodies are model manifests as JSON (the CLI turns YAML into this). Every
refusal is OpenAI-shaped JSON naming the bad field, never a stack trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import prometheus_client
from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from llmgw.control import events as ev
from llmgw.control import loadreports
from llmgw.control.auth import Auth
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.cluster import Cluster, LogsError, NodeNotConnected, in_force
from llmgw.control.http import apidocs, paging
from llmgw.control.http import audit as audit_http
from llmgw.control.http import describe as describe_http
from llmgw.control.http import engines as engines_http
from llmgw.control.http import fabric as fabric_http
from llmgw.control.http import forward as forward_http
from llmgw.control.http import keys as keys_http
from llmgw.control.http import nodecerts as nodecerts_http
from llmgw.control.http import settings as settings_http
from llmgw.control.http import tokens as tokens_http
from llmgw.control.http import users as users_http
from llmgw.control.http import weights as weights_http
from llmgw.control.http.errors import ApiError, install
from llmgw.control.routerreports import BadReport, RouterEvents
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.status import fetch_of, summarize
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredAutoscale, StoredModel, StoredNode
from llmgw.core import enginecheck, shards, specpolicy, specs
from llmgw.core.errors import ShardIdError, SpecError
from llmgw.core.shards import ShardState

MAX_BODY = 1 << 20
LONG_POLL_MAX_S = 60.0


def _replica_doc(r: ReplicaRecord, now: float, nodes: Mapping[str, NodeView] | None = None) -> dict[str, Any]:
    # ``fetch``: its weights' download as its node last reported it (null unless fetching).
    return {"id": r.id, "model": r.model, "phase": r.phase.value, "node": r.node_id, "shard": r.shard_id,
            "endpoint": r.endpoint if r.phase is Phase.READY else "", "attempt": r.attempt,
            "failures": r.failures, "message": r.message, "last_output": list(r.last_output),
            "age_s": round(now - r.created_at, 1), "fetch": fetch_of(r, nodes or {})}


def _with_router_view(doc: dict[str, Any], reports: RouterEvents) -> dict[str, Any]:
    """The replica as routers see it: ``router_ejections``, and their sentence first in the message."""
    ejections = reports.ejections(doc["id"])
    doc["router_ejections"] = [{"router": e.router, "reason": e.reason, "failures": e.failures, "for_s": e.for_s,
                                "at": e.at} for e in ejections]
    if ejections:
        said = reports.message(doc["id"])
        doc["message"] = f"{said}; {doc['message']}" if doc["message"] else said
    return doc


def _model_doc(stored: StoredModel, replicas: list[ReplicaRecord], now: float,
               states: Mapping[str, StoredAutoscale] | None = None,
               signals: loadreports.RouterSignals | None = None) -> dict[str, Any]:
    """The manifest and its status; an autoscaled model's ``replicas`` is the count in force, and with ``signals``
    its ``status.autoscale`` carries the routers' merged load as the autoscaler reads it."""
    name, auto = stored.model.name, stored.model.spec.autoscale
    spec = in_force({name: stored.model.spec}, states or {})[name]
    st = summarize(spec, replicas, now=now)
    doc = stored.model.to_manifest()
    doc["status"] = {"state": st.state, "message": st.message, "ready_replicas": st.ready,
                     "replicas": st.desired, "generation": stored.generation}
    if auto is not None:
        kept = (states or {}).get(name)
        doc["status"]["autoscale"] = loadreports.describe(
            auto, spec.replicas, last_reason=kept.last_reason if kept else "",
            last_change_at=kept.last_change_at if kept else 0.0, signals=signals, model=name, now=now)
    return doc


def _node_doc(n: StoredNode, view: NodeView | None, *, connected: bool, has_replicas: bool) -> dict[str, Any]:
    inv = view.inventory if view else n.inventory
    return {
        "id": n.id, "hostname": n.hostname, "mgmt_addr": n.mgmt_addr, "agent_version": n.agent_version,
        **describe_http.scheduling(view, connected=connected, has_replicas=has_replicas),
        "connected": connected, "last_seen": n.last_seen, "cpu_count": inv.cpu_count,
        "memory_total_bytes": inv.memory_total_bytes, "memory_available_bytes": inv.memory_available_bytes,
        "gpus": [{"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
                  "memory_used_bytes": g.memory_used_bytes, "nvlink_peers": list(g.nvlink_peers)}
                 for g in inv.gpus],
        "engines": [{"name": e, "version": v} for e, v in inv.engines],
        "shards": sum(1 for s in (view.shards.values() if view else ()) if s.state in ShardState.live()),
        "shard_states": [{"id": s.shard_id, "replica": s.replica_id, "state": s.state.value, "pid": s.pid,
                          "adopted": s.adopted, "message": s.message, "probe_failures": s.probe_failures}
                         for s in (view.shards.values() if view else ())],
        "mgmt_interface": inv.mgmt_interface,
        "host": dataclasses.asdict(inv.host),
        "hcas": [dataclasses.asdict(h) for h in inv.hcas],
        "fabrics": [dataclasses.asdict(f) for f in inv.fabrics],
        "model_dirs": [dataclasses.asdict(d) for d in inv.model_dirs],
        "weights": [dataclasses.asdict(w) for w in inv.weights],
        "nvlink": dataclasses.asdict(inv.nvlink),
        "subnet_managers": [dataclasses.asdict(x) for x in inv.subnet_managers],
        "load": {sid: {"cpu_cores": ld.cpu_cores, "rss_bytes": ld.rss_bytes}
                 for sid, ld in (view.shard_load.items() if view else ())},
    }


def _nodes_body(page: list[StoredNode], total: int, views: dict[str, NodeView], connected: set[str],
                occupied: set[str]) -> bytes:
    """One page of nodes as the API's JSON, with ``total``, how many there are in all."""
    return json.dumps({"items": [_node_doc(n, views.get(n.id), connected=n.id in connected,
                                           has_replicas=n.id in occupied) for n in page],
                       "total": total}).encode()


class _StatementsOnLoop(Collector):
    """``llmgw_store_statements_on_loop_total``: SQL run on the event loop's thread (0 unless a call site is wrong)."""

    def __init__(self, db: StoreThread) -> None:
        self.db = db

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("llmgw_store_statements_on_loop", "SQL statements run on the server's event loop "
                                  "thread instead of the store's (each held every stream and request while it ran)",
                                  value=self.db.statements_on_loop)


def create_api(store: Store | StoreThread, cluster: Cluster, *, auth: Auth, extra_registries: tuple[Any, ...] = (),
               router_events: RouterEvents | None = None, leadership: forward_http.View | None = None,
               join: tokens_http.JoinPoint | None = None) -> FastAPI:
    """The REST app; ``extra_registries`` (the in-process router's) are served on the same /metrics.

    Every store call is awaited on the store's thread (``store.offloop``), never made on the
    event loop; a plain ``Store`` is given one. ``router_events`` holds what routers report
    (the in-process router's callback writes to the same one); a fresh one when not given.
    ``auth`` decides who may call what (``Auth.insecure()``: everyone, everything); it is a required
    keyword so that no caller gets an open API by leaving it out. ``leadership`` (``leader.Leadership``)
    is what ``/api/v1/controlplanes`` lists; None (a single server): an empty list. ``join``: where agents
    join this server, for the command ``POST /api/v1/tokens`` answers; None: no join port (``--insecure``).
    """
    reports = router_events if router_events is not None else RouterEvents()
    app = FastAPI(title="llmgw control plane", version="v1", docs_url=None, redoc_url=None,
                  openapi_url=apidocs.OPENAPI_PATH)
    install(app)
    apidocs.install(app)  # /api/docs without Swagger UI's CDN assets
    db = store if isinstance(store, StoreThread) else StoreThread(store)
    # Nothing inside the auth middleware runs for a request without the credential it needs; it puts
    # the principal it proved in the scope, refused or not.
    app.add_middleware(auth_mw.AuthMiddleware, auth=auth)
    # Every mutating route recorded in one place (audit_http.AUDITED), never per handler. Added last,
    # so outermost: a change a user's role refuses (403) is recorded with who tried it.
    app.add_middleware(audit_http.AuditMiddleware, db=db)
    app.include_router(users_http.router(db, auth))
    app.include_router(audit_http.router(db))
    app.include_router(keys_http.router(db, cluster))
    app.include_router(nodecerts_http.router(db, cluster))
    app.include_router(tokens_http.router(db, join))
    app.include_router(describe_http.router(db, cluster))
    app.include_router(weights_http.router(db, cluster))
    app.include_router(fabric_http.router(cluster))
    app.include_router(engines_http.router(db, cluster))
    app.include_router(settings_http.router(db))
    # Collectors without names (the router's registry, _StatementsOnLoop) kept apart, so that a scrape
    # restricted with name[] reaches them: without it the UI's read of the router's series came back empty.
    registry = prometheus_client.CollectorRegistry(support_collectors_without_names=True)
    nodes_gauge = prometheus_client.Gauge("llmgw_nodes_connected", "Connected agents", registry=registry)
    replicas_gauge = prometheus_client.Gauge("llmgw_replicas", "Replicas by phase", ["phase"], registry=registry)
    for extra in extra_registries:
        registry.register(extra)  # a registry is a collector: one scrape gets both
    registry.register(_StatementsOnLoop(db))
    registry.register(reports.registry)

    async def _manifest(request: Request) -> specs.Model:
        body = await request.body()
        if len(body) > MAX_BODY:
            raise ApiError(413, f"body is {len(body)} bytes; the limit is {MAX_BODY}", code="too_large")
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"body is not valid JSON: {e}", code="invalid_json") from None
        except RecursionError:  # 100,000 "[" (100 kB) was a 500 with a traceback
            raise ApiError(400, "body is nested too deeply to read; a model file is a few levels deep",
                           code="invalid_json") from None
        try:
            model = specs.parse_manifest(doc)
            # The cluster's env allowlist and code flags (issue 24), with the admin's settings in force.
            policy = await settings_http.current(db)
            specpolicy.check(model.spec, allowed_env=policy.allowed_env, allow_remote_code=policy.allow_remote_code)
        except SpecError as e:
            raise ApiError(422, str(e), code="invalid_spec", param=e.field) from None
        # What the model file alone proves the engine would refuse (fp8 without a GPU, a reserved
        # flag spelt with underscores) is refused here. Checks that need the weights' metadata or
        # a node's facts run at placement, where the answer is the model's Placed condition
        # (EngineRefused): the weights a node reports can change without the model file changing.
        found = enginecheck.problems(enginecheck.Profile.of_model(model.spec))
        if found:
            raise ApiError(422, f"{model.spec.engine} would refuse this model on any node: {'; '.join(found)}",
                           code="engine_refused", param="spec")
        return model

    async def _get_stored(name: str) -> StoredModel:
        stored = await db.get_model(name)
        if stored is None:
            raise ApiError(404, f"model {name!r} does not exist; `llmgw get models` lists them",
                           code="model_not_found")
        return stored

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/models")
    async def list_models() -> dict[str, Any]:
        # The light records (``Store.list_replica_states``): Ready ones counted by the database, the others'
        # seven fields a status reads; whole replicas were 0.19 s of this call with 2,000 of them.
        replicas, models = await db.list_replica_states(), await db.list_models()
        now = time.time()
        by_model: dict[str, list[ReplicaRecord]] = {}
        for r in replicas:
            by_model.setdefault(r.model, []).append(r)
        states = await db.autoscale_states()
        return {"items": [_model_doc(m, by_model.get(m.model.name, []), now, states) for m in models]}

    async def _apply(model: specs.Model, response: Response) -> dict[str, Any]:
        before = await db.get_model(model.name)
        stored, created = await db.put_model(model)
        if before is None or before.generation != stored.generation:
            rolls = before is not None and before.model.spec.fingerprint() != model.spec.fingerprint()
            cluster.record(ev.Event(time.time(), ev.NORMAL, "Created" if created else "Updated",
                                    f"model/{model.name}", f"generation {stored.generation} applied"
                                    + ("; the engine changed, so its replicas are rolled" if rolls else ""),
                                    model=model.name))
            cluster.flush_events()
        cluster.kick()
        response.status_code = 201 if created else 200
        return _model_doc(stored, [r for r in await db.list_replicas() if r.model == model.name], time.time(),
                          await db.autoscale_states())

    @app.post("/api/v1/models")
    async def apply_model(request: Request, response: Response) -> dict[str, Any]:
        """Creates or updates the model the body describes (201 when new)."""
        return await _apply(await _manifest(request), response)

    @app.put("/api/v1/models/{name}")
    async def put_model(name: str, request: Request, response: Response) -> dict[str, Any]:
        model = await _manifest(request)
        if model.name != name:
            raise ApiError(400, f"metadata.name is {model.name!r} but the URL names {name!r}",
                           code="name_mismatch", param="metadata.name")
        return await _apply(model, response)

    @app.get("/api/v1/models/{name}")
    async def get_model(name: str) -> dict[str, Any]:
        stored = await _get_stored(name)
        return _model_doc(stored, [r for r in await db.list_replicas() if r.model == name], time.time(),
                          await db.autoscale_states(), cluster.signals)

    @app.post("/api/v1/models/{name}/scale")
    async def scale_model(name: str, request: Request, response: Response) -> dict[str, Any]:
        """Sets a model's replica count by hand (``{"replicas": N}``); refused (409) for an autoscaled model."""
        try:
            doc = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"body is not valid JSON: {e}", code="invalid_json") from None
        replicas = doc.get("replicas") if isinstance(doc, dict) else None
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, f"replicas: expected a whole number >= 0, got {replicas!r}", code="invalid_spec",
                           param="replicas")
        stored = await _get_stored(name)
        auto = stored.model.spec.autoscale
        if auto is not None:
            # The autoscaler would undo a count set by hand at its next decision: say where the count comes from.
            raise ApiError(409, f"model {name} is autoscaled (min {auto.min_replicas}, max {auto.max_replicas}); "
                                "change spec.autoscale.min_replicas/max_replicas instead", code="autoscaled",
                           param="replicas")
        model = dataclasses.replace(stored.model, spec=dataclasses.replace(stored.model.spec, replicas=replicas))
        return await _apply(model, response)

    @app.delete("/api/v1/models/{name}")
    async def delete_model(name: str) -> dict[str, Any]:
        if not await db.delete_model(name):
            await _get_stored(name)
        cluster.record(ev.Event(time.time(), ev.NORMAL, "Deleted", f"model/{name}",
                                "deleted; its replicas are drained and stopped", model=name))
        cluster.flush_events()
        cluster.kick()
        return {"deleted": name}

    @app.get("/api/v1/replicas")
    async def list_replicas(model: str | None = None) -> Response:
        replicas = await db.list_replicas()
        now = time.time()
        # json.dumps, not FastAPI's encoder, which walks every value again on the loop: measured on
        # 500 events, 16 ms against 1 ms, with every agent stream and routed request waiting.
        nodes = cluster.nodes
        return Response(json.dumps({"items": [_with_router_view(_replica_doc(r, now, nodes), reports)
                                              for r in replicas if model in (None, r.model)]}).encode(),
                        media_type="application/json")

    @app.post("/api/v1/router/events")
    async def router_report(request: Request) -> dict[str, Any]:
        """A router's ejections and recoveries of replicas (``llmgw.router.events`` gives the shape)."""
        body = await request.body()
        if len(body) > MAX_BODY:
            raise ApiError(413, f"body is {len(body)} bytes; the limit is {MAX_BODY}", code="too_large")
        try:
            applied = reports.record(json.loads(body))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"body is not valid JSON: {e}", code="invalid_json") from None
        except BadReport as e:
            raise ApiError(422, str(e), code="invalid_report") from None
        return {"applied": applied}

    @app.post("/api/v1/router/signals")
    async def router_signals(request: Request) -> dict[str, Any]:
        """A router's load report per model (``llmgw.router.signals`` builds it): the autoscaler's input."""
        body = await request.body()
        if len(body) > MAX_BODY:
            raise ApiError(413, f"body is {len(body)} bytes; the limit is {MAX_BODY}", code="too_large")
        try:
            applied = cluster.signals.record(json.loads(body))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"body is not valid JSON: {e}", code="invalid_json") from None
        except loadreports.BadReport as e:
            raise ApiError(422, str(e), code="invalid_report") from None
        return {"applied": applied}

    @app.get("/api/v1/nodes")
    async def list_nodes(offset: int = paging.offset(), limit: int = paging.limit(default=0, low=0)) -> Response:
        """Every node (``limit`` 0), or a page of them by id; ``total`` counts them all."""
        # Only the page's rows are read and only its documents built: the UI's page of 100 of 1,000
        # nodes read every node and every whole replica before (0.55 s, bench/ui_overview.py).
        (stored, total), occupied = await db.page_nodes(offset=offset, limit=limit), await db.occupied_nodes()
        # Snapshots taken on the loop; the documents (10,000 at 10,000 nodes, ~40 values each) and
        # their JSON are built in a thread, as a pass reads its snapshot (see cluster's docstring):
        # built here they held every agent stream and routed request for the whole build.
        views, connected = dict(cluster.nodes), {n.id for n in stored if cluster.connected(n.id)}
        body = await asyncio.to_thread(_nodes_body, stored, total, views, connected, occupied)
        return Response(body, media_type="application/json")

    @app.get("/api/v1/nodes/{node_id}")
    async def get_node(node_id: str) -> dict[str, Any]:
        """One node: the document its entry of ``GET /api/v1/nodes`` is (the node page polls this, not the list)."""
        stored = await db.get_node(node_id)
        if stored is None:
            raise ApiError(404, f"node {node_id!r} is not known; `llmgw get nodes` lists them", code="node_not_found")
        occupied = await db.occupied_nodes()
        return _node_doc(stored, cluster.nodes.get(node_id), connected=cluster.connected(node_id),
                         has_replicas=node_id in occupied)

    @app.get("/api/v1/nodes/{node_id}/logs")
    async def node_logs(node_id: str, shard: str = "", lines: int = Query(default=100, ge=0, le=10_000),
                        follow: bool = False) -> StreamingResponse:
        """A node's agent log (or a shard's engine output with ``shard``), as NDJSON batches of lines."""
        if shard:
            try:
                # The agent checks too; refused here, a "../../etc/passwd" never leaves the control plane.
                shards.check_shard_id(shard)
            except ShardIdError as e:
                raise ApiError(400, str(e), code="invalid_shard_id", param="shard") from None
        it = cluster.logs(node_id, shard, lines=lines, follow=follow)
        try:
            first = await anext(it)
        except StopAsyncIteration:
            first = []
        except KeyError:
            raise ApiError(404, f"node {node_id!r} is not known; `llmgw get nodes` lists them",
                           code="node_not_found") from None
        except NodeNotConnected as e:
            raise ApiError(409, str(e), code="node_not_connected") from None
        except LogsError as e:
            raise ApiError(404, str(e), code="logs_unavailable") from None

        async def body() -> AsyncIterator[bytes]:
            try:
                yield (json.dumps({"lines": first}) + "\n").encode()
                async for batch in it:
                    if batch:
                        yield (json.dumps({"lines": batch}) + "\n").encode()
            except LogsError as e:
                yield (json.dumps({"error": str(e)}) + "\n").encode()
            finally:
                await it.aclose()

        return StreamingResponse(body(), media_type="application/x-ndjson")

    @app.get("/api/v1/endpoints")
    async def endpoints(after: int | None = Query(default=None, ge=-1, le=paging.MAX_ID),
                        timeout: float = Query(default=25.0, ge=0, le=LONG_POLL_MAX_S)) -> dict[str, Any]:
        return (await cluster.wait_table(after=after, timeout=timeout)).to_doc()

    @app.get("/api/v1/whoami")
    async def whoami(request: Request) -> dict[str, Any]:
        """The caller as the API sees it: its name, role and kind (the UI's header; what a viewer may do)."""
        who = request.scope.get(auth_mw.PRINCIPAL)
        if who is None:  # the auth middleware always sets one; a bare app in a unit test may not
            return {"name": "", "role": "", "kind": ""}
        return {"name": who.name, "role": who.role, "kind": who.kind}

    @app.get("/api/v1/controlplanes")
    async def controlplanes() -> dict[str, Any]:
        """Every control plane as last read from the database: role, term, lease age, addresses, version."""
        if leadership is None:
            return {"controlplanes": [], "self": ""}
        return {"controlplanes": [dataclasses.asdict(i) for i in leadership.describe()], "self": leadership.me.id}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Every metric, or with ``name[]=`` (as client_python's own handler) only the samples so named."""
        names = request.query_params.getlist("name[]")
        nodes_gauge.set(sum(1 for n in cluster.nodes.values() if n.connected))
        # Counted only when asked for: the UI's overview reads the router's few series every 2 s, and
        # counting 2,000 replicas each time was most of that read.
        if not names or "llmgw_replicas" in names:
            counts = {p.value: 0 for p in Phase}
            for r in await db.list_replica_states():
                counts[r.phase.value] += 1
            for phase, count in counts.items():
                replicas_gauge.labels(phase=phase).set(count)
        scraped = registry.restricted_registry(names) if names else registry
        return Response(prometheus_client.generate_latest(scraped), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return app
