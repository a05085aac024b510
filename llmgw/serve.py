"""``llmgw server``: the control plane and the router in one process, started and stopped.

This module and its parts in ``llmgw.serving`` (the settings, their resolution into ``ServerConfig``,
the HTTP front) are the only ones allowed to import both ``llmgw.control`` and
``llmgw.router``, and even here they meet on the wire: the router watches the
control plane's ``/api/v1/endpoints`` over loopback HTTP exactly as a
standalone router would, so the in-process router is the same code path that
runs alone and keeps serving when the control plane is restarted.

HTTP (OpenAI API under ``/v1``, REST API under ``/api/v1``, ``/metrics``,
``/healthz``, and with ``--mirror-dir`` the weights mirror under ``/mirror``) is
one listener; the agent stream is another. ``run`` makes the control plane's parts, the lease, the
in-process router and the front, then starts them, and stops them in the reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from llmgw.control import auditprune, cpversions, datadir, engines, keyuse, loadreports, remotemeta, sso
from llmgw.control import leader as leader_mod
from llmgw.control.agentsvc import collector as agentsvc_collector
from llmgw.control.agentsvc import metrics as agentsvc_metrics
from llmgw.control.agentsvc import service as agentsvc
from llmgw.control.auth import Auth
from llmgw.control.backup import schedule as backup_schedule
from llmgw.control.batches import http as batches_http
from llmgw.control.batches.service import BatchService
from llmgw.control.cluster import Cluster
from llmgw.control.http import forward as forward_http
from llmgw.control.http.api import create_api
from llmgw.control.reconcile import decide
from llmgw.control.routerreports import RouterEvents
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.control.usage import prune as usageprune
from llmgw.control.usage.service import UsageService
from llmgw.core.errors import LlmgwError
from llmgw.core.version import version
from llmgw.mirror import app as mirror_app
from llmgw.router import auth as router_auth
from llmgw.router import metrics as router_metrics
from llmgw.router import metricsmerge
from llmgw.router import reports as router_events
from llmgw.router import server as router_server
from llmgw.router import signals as router_signals
from llmgw.router.app import RouterApp
from llmgw.router.kvfeed import LocalKvFeed
from llmgw.router.kvview import KvView
from llmgw.router.standalone import Together, proxied
from llmgw.router.table import TableHolder
from llmgw.router.watch import LocalWatcher
from llmgw.serving import front, httptls, routerworkers, startup, tokenizerfetch, tunnels
from llmgw.serving.config import (
    HUB_TOKEN_ENV,
    INSECURE_HEADER,
    MirrorConfig,
    ServerConfig,
    check_advertise,
    check_mode,
    config_of,
    hub_settings,
    lease_timing,
)

__all__ = ["INSECURE_HEADER", "HUB_TOKEN_ENV", "MirrorConfig", "ServerConfig", "check_advertise", "check_mode",
           "config_of", "hub_settings", "lease_timing", "run"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class _ControlPlane:
    """The control plane's parts, made before anything listens; started and stopped by ``run``."""

    store: Store
    db: StoreThread
    cluster: Cluster
    reports: RouterEvents
    load_signals: loadreports.RouterSignals
    key_uses: keyuse.Writer
    #: Routers' usage batches and quota syncs (issue 26), the in-process router's and standalone ones' alike.
    usage: UsageService
    #: OpenAI files and batches (issue 32); their bytes in the data directory on SQLite, in the database else.
    batches: BatchService


def _open_store(cfg: ServerConfig) -> Store:
    try:
        # A session idle inside a transaction for two leases (at least 10 s) is a server stopped mid-write.
        store = (Store.open_url(cfg.database, idle_tx_timeout_s=max(10.0, 2 * cfg.lease.lease_s)) if cfg.database
                 else Store.open(cfg.data_dir))
    except (store_mod.StoreUrlRefused, store_mod.StoreUnreachable) as e:
        raise LlmgwError(f"--database: {e}") from None
    datadir.remember_database(cfg.data_dir, cfg.database)  # a directory from before this file: it says so now
    return store


def _control_plane(cfg: ServerConfig, store: Store, hub: decide.Hub) -> _ControlPlane:
    """The cluster over the store, with what routers report (ejections, load, keys used) fed to it."""
    # What routers report about replicas (ejections), shown on each replica and weighed by the
    # reconciler as evidence of a hung engine.
    reports = RouterEvents()
    # Every store call from here on runs on the store's thread, off the loop the agents'
    # streams and the router share; the reads above and Cluster's first load are before
    # anything listens, so they hold nobody up.
    db = StoreThread(store)
    decide_cfg = decide.Config(node_grace_s=cfg.node_grace_s, unhealthy_grace_s=cfg.unhealthy_grace_s,
                               weights_gc_free_below_pct=cfg.weights_gc_free_below_pct, hub=hub,
                               sleep_overcommit=cfg.sleep_overcommit)
    # Remote models' metadata is read from where their nodes will fetch them (the mirror, or the hub).
    remote_meta = remotemeta.Reader(hub_endpoint=decide_cfg.hub.endpoint, mirror_url=decide_cfg.hub.mirror_url,
                                    token=decide_cfg.hub.token, allow_private=cfg.fetch_allow_private,
                                    cluster_ca=None if cfg.insecure else datadir.ca_cert(cfg.data_dir).read_bytes())
    # A standby until the lease is taken (at once when no other server holds it): only the leader
    # accepts agents, reconciles and writes (``control.leader``).
    # What routers report of each model's load, the autoscaler's input (issue 17): the in-process router's
    # reports arrive through a callback, a standalone router's through POST /api/v1/router/signals.
    load_signals = loadreports.RouterSignals()
    # Routers verify engines serving TLS (issue 28) with the cluster CA: its certificate goes in their table.
    engine_ca = "" if cfg.insecure else datadir.read_ca(cfg.data_dir).cert_pem.decode()
    cluster = Cluster(store, cfg=decide_cfg, ejections=reports.current, db=db, remote_meta=remote_meta, standby=True,
                      signals=load_signals, engine_ca=engine_ca)
    # Keys' "last used", as routers report it, written by the leader every few seconds per key at most.
    key_uses = keyuse.Writer(db, leading=lambda: cluster.leading)
    reports.on_key_used = key_uses.note
    files = dataclasses.replace(cfg.files, dir=None if cfg.database else cfg.data_dir / "files")
    return _ControlPlane(store, db, cluster, reports, load_signals, key_uses, UsageService(db, cfg.usage),
                         BatchService(db, files))


def _leadership(cfg: ServerConfig, cp: _ControlPlane,
                me: leader_mod.Me) -> tuple[leader_mod.Leadership, cpversions.Versions]:
    """The lease: taking it applies the engine flags and takes over (telling a new version); losing it steps down."""
    cluster = cp.cluster
    versions = cpversions.Versions(me.id, me.version, cluster.record, cluster.clock)

    async def elected(term: int) -> None:
        # Before the takeover reads the store, so the first Provision a node gets carries the index the
        # flags name.
        await cp.db.call(engines.apply_server_flags, cp.store, cluster, index_url=cfg.engine_index,
                         find_links=cfg.engine_find_links if cfg.engine_index is not None else None,
                         models_trigger_installs=cfg.model_installs, os_packages=cfg.engine_os_packages)
        await cluster.take_over(term)
        await versions.elected(cp.db)

    async def deposed(reason: str) -> None:
        cluster.step_down(reason)

    leadership = leader_mod.Leadership(cp.store, me, timing=cfg.lease, on_elected=elected, on_deposed=deposed)
    cluster.may_act = leadership.valid
    cluster.on_fenced = leadership.kick

    def hint() -> tuple[str, tuple[str, ...]]:
        found = leadership.leader()
        return (found.agent_addr if found is not None else "", leadership.peers())

    cluster.hint = hint
    return leadership, versions


def _router(cfg: ServerConfig, cp: _ControlPlane) -> RouterApp:
    """The in-process router: it reads this control plane's table as the object it publishes (no HTTP, no JSON,
    no credential) and hands its reports to the control plane through callbacks."""
    # The router's first table says whether keys exist; the guard warns then, and again
    # whenever a later table leaves this listen without any.
    listen_guard = router_auth.ListenGuard(cfg.host)
    holder = TableHolder()
    kv_view = KvView()  # kv_aware's, from this control plane's relay of the agents' KV digests
    watcher = Together(LocalWatcher(cp.cluster.wait_table, holder, listen_guard=listen_guard),
                       LocalKvFeed(kv_view, cp.cluster.kv.wait))
    return proxied(holder, cfg.router, watcher=watcher, source="this control plane", kv_view=kv_view,
                   events=router_events.CallbackSink("server", cp.reports.record),
                   signals=router_signals.Reporter("server", deliver=cp.load_signals.record,
                                                   interval_s=cfg.router.signals_interval),
                   # Budgets and usage through the same service standalone routers reach over HTTP; the
                   # router's id is this instance's, so two servers' in-process routers hold separate leases.
                   quota=cp.usage.sync, usage=cp.usage.ingest, usage_journal_dir=cfg.data_dir / "usage-journal",
                   router_id=f"server-{leader_mod.instance_id(cfg.data_dir)}",
                   tokenizer_fetch=tokenizerfetch.in_process(cp.cluster.tokenizer_files, cp.db), batches=cp.batches,
                   batch_concurrency=cfg.router.batch_concurrency, batch_waiting_below=cfg.router.batch_waiting_below)


async def run(cfg: ServerConfig, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    check_mode(cfg)
    check_advertise(cfg.advertise)
    # The data directory remembers its cluster's database: without --database, that one, not SQLite here.
    cfg = dataclasses.replace(cfg, database=datadir.database_for(cfg.data_dir, cfg.database))
    startup.init_if_needed(cfg)
    # The HTTP port's certificate (issued from the cluster CA, or the operator's checked) before anything listens.
    tls = httptls.prepare(cfg)
    store = _open_store(cfg)
    # Bound before the settings are made: a mounted mirror's URL, which nodes fetch from, has its port.
    http_sock = front.listen(cfg.host, cfg.http_port, reuse_port=cfg.router_processes > 1)
    http_port = http_sock.getsockname()[1]
    cp = _control_plane(cfg, store, front.own_mirror_hub(cfg, http_port) if cfg.mirror is not None else cfg.hub)
    cp.db.watch_loop()
    try:
        hub, access = await tunnels.start(cfg, cp.cluster, startup.agent_tls(cfg))  # issue 33: nodes behind NAT
        grpc_server, agent_port, join_port = await agentsvc.serve(
            cp.cluster, host=cfg.host, port=cfg.agent_port, tls=startup.agent_tls(cfg), join_port=cfg.join_port,
            engine_access=access, tunnel_port=hub.port if hub is not None else 0)
    except OSError as e:
        http_sock.close()
        raise LlmgwError(str(e)) from None
    advertised = startup.advertised(cfg)
    me = leader_mod.Me(id=leader_mod.instance_id(cfg.data_dir), http_url=f"{tls.plan.scheme}://{advertised}:{http_port}",
                       agent_addr=f"{advertised}:{agent_port}", version=version())
    leadership, versions = _leadership(cfg, cp, me)
    # Who may call the REST API.
    auth = Auth(cp.db, insecure=cfg.insecure, initial_password=datadir.initial_password_file(cfg.data_dir))
    # Single sign-on (--sso-issuer): its flows for the REST API and the UI, its refresher on the leader.
    sso_service = sso.SsoService(cfg.sso, cp.db, auth) if cfg.sso is not None and not cfg.insecure else None
    router = _router(cfg, cp)
    router.use_tunnels(hub)
    door = tunnels.open_door(hub, auth)  # standalone routers' way to tunnelled engines, with their router token
    # The router workers' metrics (--router-workers), summed with the in-process router's into one set of families.
    worker_metrics = metricsmerge.Snapshots()
    api = create_api(cp.db, cp.cluster, auth=auth,
                     extra_registries=(metricsmerge.Merged(router_metrics.REGISTRY, worker_metrics),
                                       agentsvc_metrics.REGISTRY, cp.usage.registry, backup_schedule.REGISTRY),
                     router_events=cp.reports, leadership=leadership,
                     join=startup.join_point(cfg, advertised, join_port),
                     usage=cp.usage, sso_service=sso_service, catalog=cfg.catalog, batches=cp.batches,
                     cluster_ca=None if cfg.insecure else datadir.ca_cert(cfg.data_dir).read_bytes(),
                     cert_files={name: cfg.data_dir / datadir.PKI / f"{name}.crt" for name in ("ca", "api", "server")})
    # A standby answers routers' tables, /healthz, /metrics and the control planes' list itself, and
    # forwards the rest of the REST API to the leader (which has the agents: node liveness, logs).
    # A leader's https:// URL is verified with the cluster CA (and the system's roots, for an operator's certificate).
    rest = forward_http.standby(api, leadership, ca_file=datadir.ca_cert(cfg.data_dir)
                                if tls.plan.on and datadir.is_initialised(cfg.data_dir) else None)
    # The mirror's app is mounted, so its lifespan never runs: its upstream client is closed at the stop.
    mirror = (mirror_app.build(cfg.mirror.dir, upstream=cfg.mirror.upstream, admin_token=cfg.mirror.admin_token,
                               stats_auth=front.admin_check(auth))
              if cfg.mirror is not None else None)
    # The router's own HTTP server, as a standalone router has (router/server.py): uvicorn's
    # per-request machinery cost the router more than its own work.
    served = front.dispatch(router, rest, mirror=mirror, behind_tls_proxy=cfg.tls.marked_plain,
                            callback_urls=front.callback_urls(cfg, http_port),
                            batches=batches_http.create_app(cp.batches))
    # Only a router worker sets the headers the internal listener reads; a client's are dropped.
    web = router_server.Server(routerworkers.untrusting(served), max_body_bytes=cfg.router.max_body_bytes,
                               limits=cfg.router.limits, marks=tls.marks)
    lease_task = asyncio.create_task(leadership.run())
    # The first lease round before the first request: a server alone leads at once, and a client that
    # called it as soon as it listened got a standby's 503 before.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(leadership.settled.wait(), cfg.lease.lease_s)
    await web.start_on(http_sock, ssl=tls.context)
    tls.start_watching()
    tasks = _Tasks.start(cfg, cp, sso_service, versions.watch(lambda: cp.cluster.leading, leadership.describe))
    await router.startup()
    crew = None
    if cfg.router_processes > 1:
        crew = routerworkers.RouterWorkers(cfg, http_port=http_port, front=served, router_id=f"server-{me.id}",
                                           services=routerworkers.Services(cp.cluster, cp.reports, cp.usage,
                                                                           worker_metrics),
                                           tls_files=tls.files, tunnels=hub)
        await crew.start()
    log.info("llmgw server %s: API at %s (OpenAI API /v1, REST /api/v1) on %s:%d, %s, in %d router process%s, "
             "agents on %s:%d (%s), %s, data in %s; advertised as %s and %s", me.id, me.http_url, cfg.host, http_port,
             tls.describe(), cfg.router_processes, "" if cfg.router_processes == 1 else "es", cfg.host, agent_port,
             "plaintext" if cfg.insecure else "mutual TLS",
             f"joins on {cfg.host}:{join_port}" if join_port else "no join port", cfg.data_dir, me.http_url,
             me.agent_addr)
    if cfg.ports_file:
        cfg.ports_file.write_text(json.dumps({"http_port": http_port, "agent_port": agent_port,
                                              "join_port": join_port, "router_processes": cfg.router_processes,
                                              "tunnel_port": hub.port if hub is not None else 0}))
    reachability = asyncio.create_task(tunnels.check_reachable(cp.cluster, access), name="engine access check")
    try:
        await _until_stopped(stop, tasks.reconcile, lease_task)
    finally:
        log.info("llmgw server stopping")
        reachability.cancel()
        if door is not None:
            door.stop()
        if hub is not None:
            await hub.stop()
        await cp.cluster.close()
        # Open long polls (a watching router, `llmgw events -f`) and streams get 3 s, then are cut: here and in
        # the router workers, which stop listening with this process and finish theirs meanwhile.
        await asyncio.gather(web.shutdown(routerworkers.GRACE_S), *([crew.stop()] if crew is not None else []))
        await tls.stop()
        await rest.close()
        await router.shutdown()
        if mirror is not None:
            # Its pulls in flight are cancelled and the upstream session closed (aiohttp warns of an
            # unclosed session at exit otherwise, and a pull's temporary file would stay open).
            await mirror.state.mirror.aclose()
        await _stop_grpc(grpc_server)
        await tasks.stop(leadership, lease_task)
        if sso_service is not None:
            await sso_service.aclose()
        await cp.usage.close()
        cp.key_uses.close()  # the last uses the router flushed at its shutdown, queued before the store closes
        await asyncio.to_thread(cp.db.close)  # the writes still queued (the agents' disconnects) first
        # Then the lease, given up at once: a standby leads without waiting it out.
        await leadership.release()
        store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _until_stopped(stop: asyncio.Event, *tasks: asyncio.Task[None]) -> None:
    """Until ``stop`` is set or one of ``tasks`` ends; a task's exception is raised."""
    done, _ = await asyncio.wait([asyncio.create_task(stop.wait()), *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task in done and task.exception():
            raise task.exception()  # type: ignore[misc]


async def _stop_grpc(grpc_server: Any) -> None:
    # Bounded: grpc.aio's stop now and then never returned when an agent's last message (its goodbye)
    # crossed the stop, though every stream handler had ended (seen twice in 40 stops under load: the
    # server logged "stopping", then ran its loop for good). Past the bound the process goes on out.
    try:
        await asyncio.wait_for(grpc_server.stop(grace=1.0), timeout=5.0)
    except TimeoutError:
        log.warning("the agent port's gRPC server did not stop within 5 s; going on without it")


def _backups(cfg: ServerConfig, cp: _ControlPlane) -> tuple[asyncio.Task[None], ...]:
    """The scheduled backups (``--backup-dir``), on the leader; their outcome an event on ``cluster/backup``."""
    def record(event: Any) -> None:
        cp.cluster.record(event)
        cp.cluster.flush_events()

    return () if cfg.backup is None else (asyncio.create_task(backup_schedule.run(
        cfg.backup, data_dir=cfg.data_dir, database=cfg.database, leading=lambda: cp.cluster.leading, record=record)),)


@dataclasses.dataclass(slots=True)
class _Tasks:
    """The background tasks of a running server: the reconcile loop, loop-lag watch, gc, audit pruning."""

    reconcile: asyncio.Task[None]
    others: tuple[asyncio.Task[None], ...]

    @classmethod
    def start(cls, cfg: ServerConfig, cp: _ControlPlane, sso_service: sso.SsoService | None = None,
              *more: Coroutine[Any, Any, None]) -> _Tasks:
        refresher = () if sso_service is None else (
            asyncio.create_task(sso_service.refresher.run(leading=lambda: cp.cluster.leading)),)
        return cls(asyncio.create_task(cp.cluster.run()), (*refresher, *(asyncio.create_task(c) for c in more),
            asyncio.create_task(agentsvc_metrics.watch_loop_lag()),
            asyncio.create_task(agentsvc_collector.manage()),
            asyncio.create_task(auditprune.run(cp.db, retention_s=cfg.audit_retention_s,
                                               leading=lambda: cp.cluster.leading)),
            asyncio.create_task(usageprune.run(cp.db, cfg.usage, leading=lambda: cp.cluster.leading)),
            asyncio.create_task(cp.usage.follow(cp.cluster.wait_table)), *_backups(cfg, cp),
            asyncio.create_task(cp.batches.run(lambda: cp.cluster.leading))))

    async def stop(self, leadership: leader_mod.Leadership, lease_task: asyncio.Task[None]) -> None:
        leadership.stop()
        lease_task.cancel()
        for task in self.others:
            task.cancel()
        # Cancelled again until it ends: on Python 3.11 ``asyncio.wait_for`` drops a cancellation that arrives as
        # its inner future completes (gh-86296), and the loop's wait for a kick is one. A server stopped while its
        # agents were connected hung here: their streams, closed just before, kick the loop as it is cancelled.
        while not self.reconcile.done():
            self.reconcile.cancel()
            await asyncio.wait([self.reconcile], timeout=0.5)
        with contextlib.suppress(asyncio.CancelledError):
            await self.reconcile
