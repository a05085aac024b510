"""``llmgw server``: the control plane and the router in one process.

This is the one module allowed to import both ``llmgw.control`` and
``llmgw.router``, and even here they meet on the wire: the router watches the
control plane's ``/api/v1/endpoints`` over loopback HTTP exactly as a
standalone router would, so the in-process router is the same code path that
runs alone and keeps serving when the control plane is restarted.

HTTP (OpenAI API under ``/v1``, REST API under ``/api/v1``, ``/metrics``,
``/healthz``, and with ``--mirror-dir`` the weights mirror under ``/mirror``) is
one listener; the agent stream is another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
import ipaddress
import json
import logging
import re
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from llmgw.control import auditprune, datadir, engines, keyuse, loadreports, remotemeta
from llmgw.control import leader as leader_mod
from llmgw.control.agentsvc import collector as agentsvc_collector
from llmgw.control.agentsvc import join as agentsvc_join
from llmgw.control.agentsvc import metrics as agentsvc_metrics
from llmgw.control.agentsvc import service as agentsvc
from llmgw.control.auth import Auth, principals
from llmgw.control.cluster import Cluster
from llmgw.control.http import forward as forward_http
from llmgw.control.http import tokens as tokens_http
from llmgw.control.http.api import create_api
from llmgw.control.reconcile import decide
from llmgw.control.routerreports import RouterEvents
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.control.ui import app as ui_app
from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.mirror import app as mirror_app
from llmgw.router import auth as router_auth
from llmgw.router import limits as router_limits
from llmgw.router import metrics as router_metrics
from llmgw.router import reports as router_events
from llmgw.router import server as router_server
from llmgw.router import signals as router_signals
from llmgw.router import tracing as router_tracing
from llmgw.router.app import RouterApp
from llmgw.router.table import TableHolder
from llmgw.router.watch import TableWatcher

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    http_port: int = 8080
    agent_port: int = 8081
    data_dir: Path = Path(".")
    #: Where to write {"http_port", "agent_port"} once listening (for ``up`` and tests with port 0).
    ports_file: Path | None = None
    #: Seconds a disconnected node keeps its replicas before they are placed elsewhere.
    node_grace_s: float = 30.0
    #: Seconds a shard its agent calls Unhealthy stays so before it is replaced
    #: (``decide.Config.unhealthy_grace_s`` says why 30).
    unhealthy_grace_s: float = 30.0
    #: An OTLP/HTTP collector for the router's spans ("": tracing off).
    tracing_endpoint: str = ""
    #: Fetched weights no model asks for go from nodes with less than this percent free (``weightsgc``).
    weights_gc_free_below_pct: float = 10.0
    #: Where nodes fetch remote weights from, and the hub's token (``hub_settings``).
    hub: decide.Hub = decide.Hub()
    #: The weights mirror served at ``/mirror`` on the HTTP port (None: not served here).
    mirror: MirrorConfig | None = None
    #: Hosts (host or host:port, "*": any) the control plane's remote reads may reach although they are
    #: loopback, link-local or its own (``--fetch-allow-private``; ``control.netguard``).
    fetch_allow_private: tuple[str, ...] = ()
    #: Loopback development only: the agent port plaintext, no join port, any node id (and REST open).
    insecure: bool = False
    #: Where `llmgw agent join` reaches the control plane (TLS, server-auth only; 0 picks a free port).
    join_port: int = 8082
    #: How long a node certificate is valid; agents renew at two thirds over their stream.
    node_cert_validity_s: float = 365 * 86400.0
    #: How long the audit log keeps an entry; the leader prunes older ones (``control.auditprune``).
    audit_retention_s: float = 90 * 86400.0
    #: The engine package index (``--engine-index``): None keeps the stored setting; given, it is stored and wins.
    engine_index: str | None = None
    #: With ``engine_index``: it is a wheelhouse page (pip --find-links), not a simple index.
    engine_find_links: bool = False
    #: Whether models' engine_version may trigger installs: None keeps the stored setting (default yes).
    model_installs: bool | None = None
    #: Whether root agents install the OS packages engines (and perftest) need; None: the stored setting (off).
    engine_os_packages: bool | None = None
    #: The store's SQLAlchemy URL, e.g. ``postgresql+psycopg://USER@HOST:PORT/DB`` (``--database``);
    #: "" keeps SQLite in the data directory.
    database: str = ""
    #: The host agents and other control planes reach this one by ("": --host, or the FQDN on a wildcard).
    advertise: str = ""
    #: The leader lease's timings (several servers on one database; one alone takes it at once).
    lease: leader_mod.Timing = leader_mod.Timing()
    #: The HTTP server's limits on reading requests: header/body/idle timeouts, connections per address.
    http_limits: router_limits.Limits = router_limits.Limits()


#: Where the mounted mirror answers on the server's HTTP port.
MIRROR_PREFIX = "/mirror"
#: Where the admin web UI answers (``llmgw.control.ui``).
UI_PREFIX = "/ui"


@dataclasses.dataclass(frozen=True, slots=True)
class MirrorConfig:
    """``llmgw server --mirror-dir``: the mirror mounted in the server, so a cluster needs one flag."""

    dir: Path
    #: Pull missing files through from this HF-compatible endpoint ("": serve only what ``dir`` holds).
    upstream: str = ""
    #: The mirror's admin API (POST /admin/add) needs this bearer token ("": the admin API is off).
    admin_token: str = dataclasses.field(default="", repr=False)
    #: No --hub-endpoint was given: hf:// sources come from this mirror.
    serves_hub: bool = True
    #: No --mirror-url was given: mirror:// sources come from this mirror.
    serves_files: bool = True


#: The variable the hub's token is read from when no --hub-token-file is given.
HUB_TOKEN_ENV = "LLMGW_HF_TOKEN"


def hub_settings(*, endpoint: str, mirror_url: str, token_file: Path | None, env: Mapping[str, str],
                 quiet: bool = False) -> decide.Hub:
    """The hub settings from the flags, the token from its file or ``LLMGW_HF_TOKEN``; LlmgwError saying what to fix.

    The token is never a flag: an argv is readable by every user of the
    machine (``ps``, /proc) and lands in shell histories and unit files.
    """
    for flag, url in (("--hub-endpoint", endpoint), ("--mirror-url", mirror_url)):
        if url and not url.startswith(("http://", "https://")):
            raise LlmgwError(f"{flag} {url!r}: expected an http:// or https:// URL")
    token = ""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise LlmgwError(f"cannot read --hub-token-file {token_file}: {e.strerror or e}") from None
        if not token:
            raise LlmgwError(f"--hub-token-file {token_file} is empty; put the hub's token in it, or leave the "
                             "flag out to fetch without one")
    else:
        token = env.get(HUB_TOKEN_ENV, "").strip()
    hub = decide.Hub(endpoint=endpoint.rstrip("/") or decide.DEFAULT_HUB_ENDPOINT, mirror_url=mirror_url.rstrip("/"),
                     token=token)
    if not quiet:   # quiet: a mounted mirror may stand in for both URLs, and its own line says which
        log.info("remote weights: hf:// from %s%s, mirror:// from %s", hub.endpoint,
                 " with a token" if token else " without a token", hub.mirror_url or "nowhere (no --mirror-url)")
    return hub


def lease_timing(*, lease: float, renew: float) -> leader_mod.Timing:
    """The lease's timings from ``--lease`` and ``--lease-renew``: the leader stops acting a quarter of the
    lease before it could expire anywhere. LlmgwError when a renewal could not come twice in that time."""
    timing = leader_mod.Timing(lease_s=lease, renew_s=renew, margin_s=lease / 4)
    timing.check()
    return timing


def _version() -> str:
    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def _advertised(cfg: ServerConfig) -> str:
    host = cfg.advertise or (socket.getfqdn() if cfg.host in ("0.0.0.0", "::", "") else cfg.host)
    return f"[{host.strip('[]')}]" if ":" in host else host


def _dispatch(router: RouterApp, api: Any, *, mirror: Any = None) -> Any:
    # The admin UI reads everything through ``api`` in-process, with the browser's own credential.
    ui = ui_app.create_ui(api)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith("/v1/"):
            await router(scope, receive, send)
        elif path == UI_PREFIX or path.startswith(UI_PREFIX + "/"):
            await ui({**scope, "root_path": scope.get("root_path", "") + UI_PREFIX}, receive, send)
        elif path == "/" and any(k == b"accept" and b"text/html" in v for k, v in scope.get("headers", ())):
            # A browser opening the server's address lands on the UI; API clients keep what they had.
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", UI_PREFIX.encode()
                                                                                   + b"/"), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
        elif mirror is not None and (path == MIRROR_PREFIX or path.startswith(MIRROR_PREFIX + "/")):
            # As starlette's Mount does: the mirror's routes match the path past root_path.
            await mirror({**scope, "root_path": scope.get("root_path", "") + MIRROR_PREFIX}, receive, send)
        else:
            await api(scope, receive, send)

    return app


def _admin_check(auth: Auth) -> Callable[[str], Awaitable[bool]]:
    """Whether a bearer token is an admin's of this control plane: the mounted mirror's /admin/stats asks it."""
    async def is_admin(token: str) -> bool:
        if auth.is_insecure:
            return True   # as every REST call is, in loopback development
        found = await auth.principal(token) if token else None
        return found is not None and found.role == principals.ADMIN
    return is_admin


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise LlmgwError(f"cannot listen on {host}:{port}: {e.strerror}; "
                         "pass --http-port to use another port") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _loopback_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        return f"http://127.0.0.1:{port}"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _own_mirror_hub(cfg: ServerConfig, http_port: int) -> decide.Hub:
    """The hub settings with this server's ``/mirror`` for what no flag named; nodes must reach the URL.

    On a wildcard address the URL names this host (its FQDN): a loopback URL would send every other
    node's fetch to itself.
    """
    assert cfg.mirror is not None
    host = socket.getfqdn() if cfg.host in ("0.0.0.0", "::", "") else cfg.host
    own = (f"http://[{host}]:{http_port}" if ":" in host else f"http://{host}:{http_port}") + MIRROR_PREFIX
    hub = dataclasses.replace(cfg.hub, endpoint=own if cfg.mirror.serves_hub else cfg.hub.endpoint,
                              mirror_url=own if cfg.mirror.serves_files else cfg.hub.mirror_url)
    log.info("weights mirror of %s at %s%s; remote weights: hf:// from %s%s, mirror:// from %s (--hub-endpoint, "
             "--mirror-url to name another address)", cfg.mirror.dir, own,
             f", pulling through from {cfg.mirror.upstream}" if cfg.mirror.upstream else "", hub.endpoint,
             " with a token" if hub.token else " without a token", hub.mirror_url or "nowhere")
    return hub


#: Every REST answer of an ``--insecure`` server carries this header; the CLI warns on seeing it.
INSECURE_HEADER = "X-Llmgw-Insecure"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost (or a wildcard): it may be reached from elsewhere


#: One label of a host name (RFC 1123; the underscore some internal DNS zones use is let through).
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def check_advertise(host: str) -> None:
    """Refuses an ``--advertise-address`` no other machine could use, with a sentence saying what to give instead.

    Checked at start: the address is only used when an agent is sent to it or a standby forwards to it, and
    without the check ``http://h`` given here became the forward address ``http://[http://h]:8080`` (its colon
    taken for an IPv6 address's), found only when a standby first failed to reach it.
    """
    if not host:
        return
    said = f"--advertise-address {host!r}"
    want = "give the host name or IP address other machines reach this server by, e.g. ctl.example.com or 10.0.0.5"
    if "://" in host:
        raise LlmgwError(f"{said}: a URL; {want} (no scheme: the ports come from --http-port and --agent-port)")
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.is_unspecified:
            raise LlmgwError(f"{said}: a wildcard is where a server listens, not an address anyone can reach; {want}")
        return
    if ":" in host:
        raise LlmgwError(f"{said}: not a host (a port is not part of it: the ports come from --http-port and "
                         f"--agent-port); {want}")
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise LlmgwError(f"{said}: not a host name (letters, digits and hyphens, in dot-separated labels of at "
                         f"most 63); {want}")


def check_mode(cfg: ServerConfig) -> None:
    """Refuses ``--insecure`` off loopback; warns loudly on it. LlmgwError says what to do instead."""
    if not cfg.insecure:
        return
    if not _is_loopback(cfg.host):
        raise LlmgwError(f"--insecure is for loopback development only: on --host {cfg.host} anyone who reaches it "
                         "could change the cluster, read every engine's key and join as any node. Leave "
                         "--insecure out (the REST API then needs a login and agents join with a token), or listen "
                         "on 127.0.0.1")
    log.warning("INSECURE: --insecure turns authentication off: the REST API answers anyone on this machine as an "
                "administrator and the agent stream is plaintext with any node id. For loopback development only; "
                "every REST answer says so (%s: 1)", INSECURE_HEADER)


def _init_if_needed(cfg: ServerConfig) -> None:
    """First start of a secure server: ``llmgw init`` done here, the password printed once to the terminal.

    Printed, not logged: a log line is kept in files and journals, and the password must live only
    on the terminal of whoever started the server (the store keeps its argon2 hash). Without a terminal,
    in a 0600 file of the data directory instead (``datadir.tell_admin_password``).
    """
    if cfg.insecure or datadir.is_initialised(cfg.data_dir):
        return
    wildcard = cfg.host in ("0.0.0.0", "::", "")
    hosts = [socket.getfqdn()] if wildcard else [] if cfg.host == "localhost" else [cfg.host.strip("[]")]
    try:
        done = datadir.init(cfg.data_dir, hosts=hosts, database=cfg.database)
    except (store_mod.StoreUrlRefused, store_mod.StoreUnreachable) as e:
        raise LlmgwError(f"--database: {e}") from None
    # On a terminal, printed; under a service manager (its journal keeps stderr) a 0600 file, named here.
    datadir.tell_admin_password(done, sys.stderr)


def _join_point(cfg: ServerConfig, advertised: str, join_port: int) -> tokens_http.JoinPoint | None:
    """Where agents join: the advertised host and the join port this server really listens on (the command
    ``POST /api/v1/tokens`` answers names it; `llmgw token create` printed 8082 whatever the port was)."""
    if cfg.insecure or not join_port:
        return None
    return tokens_http.JoinPoint(f"{advertised}:{join_port}", pki.ca_hash(datadir.read_ca(cfg.data_dir).cert_pem))


def _agent_tls(cfg: ServerConfig) -> agentsvc_join.AgentTls | None:
    """The agent service's CA and certificate from the data directory; None with ``--insecure``."""
    if cfg.insecure:
        return None
    pki_dir = cfg.data_dir / datadir.PKI
    try:
        return agentsvc_join.AgentTls(ca=datadir.read_ca(cfg.data_dir),
                                      server_cert_pem=(pki_dir / "server.crt").read_bytes(),
                                      server_key_pem=(pki_dir / "server.key").read_bytes(),
                                      node_cert_validity_s=cfg.node_cert_validity_s)
    except OSError as e:
        raise LlmgwError(f"cannot read the server's certificate in {pki_dir}: {e.strerror or e}; it is made by "
                         "`llmgw init`") from None


async def run(cfg: ServerConfig, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    check_mode(cfg)
    check_advertise(cfg.advertise)
    # The data directory remembers its cluster's database: without --database, that one, not SQLite here.
    cfg = dataclasses.replace(cfg, database=datadir.database_for(cfg.data_dir, cfg.database))
    _init_if_needed(cfg)
    try:
        store = Store.open_url(cfg.database) if cfg.database else Store.open(cfg.data_dir)
    except (store_mod.StoreUrlRefused, store_mod.StoreUnreachable) as e:
        raise LlmgwError(f"--database: {e}") from None
    datadir.remember_database(cfg.data_dir, cfg.database)  # a directory from before this file: it says so now
    # The router's first table says whether keys exist; the guard warns then, and again
    # whenever a later table leaves this listen without any.
    listen_guard = router_auth.ListenGuard(cfg.host)
    tracing = router_tracing.Tracing(cfg.tracing_endpoint) if cfg.tracing_endpoint else None
    # What routers report about replicas (ejections), shown on each replica and weighed by the
    # reconciler as evidence of a hung engine.
    reports = RouterEvents()
    # Every store call from here on runs on the store's thread, off the loop the agents'
    # streams and the router share; the reads above and Cluster's first load are before
    # anything listens, so they hold nobody up.
    db = StoreThread(store)
    # Bound before the settings are made: a mounted mirror's URL, which nodes fetch from, has its port.
    http_sock = _listen(cfg.host, cfg.http_port)
    http_port = http_sock.getsockname()[1]
    hub = _own_mirror_hub(cfg, http_port) if cfg.mirror is not None else cfg.hub
    decide_cfg = decide.Config(node_grace_s=cfg.node_grace_s, unhealthy_grace_s=cfg.unhealthy_grace_s,
                               weights_gc_free_below_pct=cfg.weights_gc_free_below_pct, hub=hub)
    # Remote models' metadata is read from where their nodes will fetch them (the mirror, or the hub).
    remote_meta = remotemeta.Reader(hub_endpoint=decide_cfg.hub.endpoint, mirror_url=decide_cfg.hub.mirror_url,
                                    token=decide_cfg.hub.token, allow_private=cfg.fetch_allow_private)
    # A standby until the lease is taken (at once when no other server holds it): only the leader
    # accepts agents, reconciles and writes (``control.leader``).
    # What routers report of each model's load, the autoscaler's input (issue 17): the in-process router's
    # reports arrive through a callback, a standalone router's through POST /api/v1/router/signals.
    load_signals = loadreports.RouterSignals()
    cluster = Cluster(store, cfg=decide_cfg, ejections=reports.current, db=db, remote_meta=remote_meta, standby=True,
                      signals=load_signals)
    # Keys' "last used", as routers report it, written by the leader every few seconds per key at most.
    key_uses = keyuse.Writer(db, leading=lambda: cluster.leading)
    reports.on_key_used = key_uses.note
    db.watch_loop()
    try:
        grpc_server, agent_port, join_port = await agentsvc.serve(
            cluster, host=cfg.host, port=cfg.agent_port, tls=_agent_tls(cfg), join_port=cfg.join_port)
    except OSError as e:
        http_sock.close()
        raise LlmgwError(str(e)) from None
    advertised = _advertised(cfg)
    me = leader_mod.Me(id=leader_mod.instance_id(cfg.data_dir), http_url=f"http://{advertised}:{http_port}",
                       agent_addr=f"{advertised}:{agent_port}", version=_version())

    async def elected(term: int) -> None:
        # Before the takeover reads the store, so the first Provision a node gets carries the index the
        # flags name.
        await db.call(engines.apply_server_flags, store, cluster, index_url=cfg.engine_index,
                      find_links=cfg.engine_find_links if cfg.engine_index is not None else None,
                      models_trigger_installs=cfg.model_installs, os_packages=cfg.engine_os_packages)
        await cluster.take_over(term)

    async def deposed(reason: str) -> None:
        cluster.step_down(reason)

    leadership = leader_mod.Leadership(store, me, timing=cfg.lease, on_elected=elected, on_deposed=deposed)
    cluster.may_act = leadership.valid
    cluster.on_fenced = leadership.kick

    def hint() -> tuple[str, tuple[str, ...]]:
        found = leadership.leader()
        return (found.agent_addr if found is not None else "", leadership.peers())

    cluster.hint = hint
    holder = TableHolder()
    control_url = _loopback_url(cfg.host, http_port)
    # Who may call the REST API. The in-process router proves itself with a token minted in memory,
    # given to its watcher and nothing else, and never stored: it dies with this process.
    auth = Auth(db, insecure=cfg.insecure, initial_password=datadir.initial_password_file(cfg.data_dir))
    router_headers = {} if cfg.insecure else {"Authorization": f"Bearer {auth.mint_router_token('server')}"}
    watcher = TableWatcher(control_url, holder, listen_guard=listen_guard, headers=router_headers)
    # Ejections reach the control plane through a callback: the router and the control
    # plane share only the report's JSON shape, exactly what a standalone router POSTs.
    router = RouterApp(holder, watcher=watcher, source=f"the control plane at {control_url}",
                       events=router_events.CallbackSink("server", reports.record), tracing=tracing,
                       signals=router_signals.Reporter("server", deliver=load_signals.record))
    api = create_api(db, cluster, auth=auth, extra_registries=(router_metrics.REGISTRY, agentsvc_metrics.REGISTRY),
                     router_events=reports, leadership=leadership, join=_join_point(cfg, advertised, join_port))
    # A standby answers routers' tables, /healthz, /metrics and the control planes' list itself, and
    # forwards the rest of the REST API to the leader (which has the agents: node liveness, logs).
    front = forward_http.standby(api, leadership)
    # The router's own HTTP server, as a standalone router has (router/server.py): uvicorn's
    # per-request machinery cost the router more than its own work.
    # The mirror's app is mounted, so its lifespan never runs: its upstream client is closed below.
    mirror = (mirror_app.build(cfg.mirror.dir, upstream=cfg.mirror.upstream, admin_token=cfg.mirror.admin_token,
                               stats_auth=_admin_check(auth))
              if cfg.mirror is not None else None)
    web = router_server.Server(_dispatch(router, front, mirror=mirror), limits=cfg.http_limits)
    lease_task = asyncio.create_task(leadership.run())
    # The first lease round before the first request: a server alone leads at once, and a client that
    # called it as soon as it listened got a standby's 503 before.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(leadership.settled.wait(), cfg.lease.lease_s)
    await web.start_on(http_sock)
    reconcile_task = asyncio.create_task(cluster.run())
    lag_task = asyncio.create_task(agentsvc_metrics.watch_loop_lag())
    gc_task = asyncio.create_task(agentsvc_collector.manage())
    prune_task = asyncio.create_task(auditprune.run(db, retention_s=cfg.audit_retention_s,
                                                    leading=lambda: cluster.leading))
    await router.startup()
    log.info("llmgw server %s: HTTP on %s:%d (OpenAI API /v1, REST /api/v1), agents on %s:%d (%s), %s, data in %s; "
             "advertised as %s and %s", me.id, cfg.host, http_port, cfg.host, agent_port,
             "plaintext" if cfg.insecure else "mutual TLS",
             f"joins on {cfg.host}:{join_port}" if join_port else "no join port", cfg.data_dir, me.http_url,
             me.agent_addr)
    if cfg.ports_file:
        cfg.ports_file.write_text(json.dumps({"http_port": http_port, "agent_port": agent_port,
                                              "join_port": join_port}))
    try:
        done, _ = await asyncio.wait([asyncio.create_task(stop.wait()), reconcile_task, lease_task],
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in (reconcile_task, lease_task):
            if task in done and task.exception():
                raise task.exception()  # type: ignore[misc]
    finally:
        log.info("llmgw server stopping")
        await cluster.close()
        # Open long polls (a watching router, `llmgw events -f`) get 3 s, then are cut.
        await web.shutdown(3.0)
        await front.close()
        await router.shutdown()
        if mirror is not None:
            # Its pulls in flight are cancelled and the upstream session closed (aiohttp warns of an
            # unclosed session at exit otherwise, and a pull's temporary file would stay open).
            await mirror.state.mirror.aclose()
        # Bounded: grpc.aio's stop now and then never returned when an agent's last message (its goodbye)
        # crossed the stop, though every stream handler had ended (seen twice in 40 stops under load: the
        # server logged "stopping", then ran its loop for good). Past the bound the process goes on out.
        try:
            await asyncio.wait_for(grpc_server.stop(grace=1.0), timeout=5.0)
        except TimeoutError:
            log.warning("the agent port's gRPC server did not stop within 5 s; going on without it")
        reconcile_task.cancel()
        leadership.stop()
        lease_task.cancel()
        lag_task.cancel()
        gc_task.cancel()
        prune_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reconcile_task
        key_uses.close()  # the last uses the router flushed at its shutdown, queued before the store closes
        await asyncio.to_thread(db.close)  # the writes still queued (the agents' disconnects) first
        # Then the lease, given up at once: a standby leads without waiting it out.
        await leadership.release()
        store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
