"""Running the router on its own: ``python -m llmgw.router.standalone``.

Either from a static table (``--table-file``, an endpoints document as the
control plane serves it; for tests and benchmarks) or following a control
plane (``--control URL[,URL...]``: with several, the leader and its standbys,
it follows one and moves to the next when that one stops answering). The server
is the router's own (``server``: asyncio and httptools, on uvloop when it is
installed) rather than uvicorn, whose per-request machinery cost more than the
proxying at capacity; the app's pools open before it listens and close after it
stopped. No access log: a log line per request costs more than the proxying
does. Alone, the router serves its own ``GET /metrics``.

SIGTERM or SIGINT stops listening at once, lets open requests (streams) finish
for ``--graceful-shutdown`` seconds, then cuts them. The flags are ``RouterSettings``'s fields
(``router.settings``).

With ``--workers`` other than 1 the process started is a hub (``router.hub``) that serves nothing itself and
runs that many of these as its workers; a worker (``HUB_PID_ENV`` names its hub) listens with SO_REUSEPORT
and stops, as on SIGTERM, once its hub is gone. A worker of ``llmgw server --router-workers`` is also given
the server's internal URL (``passthrough.PASSTHROUGH_ENV``) and passes it every request but ``/v1/...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from llmgw.core import settingsgen
from llmgw.router import app as app_mod
from llmgw.router import (
    auth,
    controlpass,
    controltls,
    httphead,
    hubfiles,
    kvfeed,
    kvview,
    limits,
    metricspush,
    passthrough,
    reports,
    signals,
    tlslisten,
    tracing,
    usagehttp,
    watch,
)
from llmgw.router import server as server_mod
from llmgw.router import table as table_mod
from llmgw.router.settings import HUB_PID_ENV, HUB_STATIC_ENV, TOKEN_ENV, ProxySettings, RouterSettings
from llmgw.router.tunnel import relay as tunnelrelay
from llmgw.router.tunnel import remote as tunnelremote

#: The settings file when no --config is given (``RouterSettings.ENV_PREFIX`` + CONFIG, as ``llmgw router``).
CONFIG_ENV = RouterSettings.ENV_PREFIX + "CONFIG"

log = logging.getLogger("llmgw.router")


def read_token(token_file: Path | None, env: Mapping[str, str]) -> str:
    """The router's token from ``--token-file``, else ``LLMGW_ROUTER_TOKEN``, else ""; ValueError saying what is wrong.

    Never a flag's value: an argv is readable by every user of the machine (``ps``, /proc).
    """
    if token_file is None:
        return env.get(TOKEN_ENV, "").strip()
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read --token-file {token_file}: {exc.strerror or exc}") from None
    if not token:
        raise ValueError(f"--token-file {token_file} is empty; put the token of `llmgw router-token create NAME` in it")
    return token


def build(settings: RouterSettings, *, token: str = "", static_hub: bool = False,
          worker: bool = False, control_ssl: ssl.SSLContext | None = None) -> app_mod.RouterApp:
    """A RouterApp over a static table or one followed from a control plane, serving its own /metrics.

    Following a control plane (one URL, or several tried in turn), it reports ejections and the
    autoscaler's load signals to the one it follows as ``router_id``, and proves itself to it with
    ``token`` (a router credential), every ``signals_interval`` and at once when it holds a request
    for a model at zero. Keyless tables get a warning unless ``host`` is loopback. ``static_hub``: it follows
    a hub serving a static table (``HUB_STATIC_ENV``): budgets only, no usage, load reports or events.
    ``worker``: it is a hub's worker (``HUB_PID_ENV``): it pushes its metrics to the hub, and its ``/metrics``
    answers every worker's sum (``metricspush``). ``control_ssl``: what every session to the control plane
    verifies with (``controltls.resolve``: ``--control-ca``/``--control-ca-hash``); None: the system's authorities.
    """
    holder = table_mod.TableHolder()
    watcher: app_mod.Lifecycle | None = None
    metered: dict[str, Any] = {}
    sink: reports.Sink | None = None
    reporter: signals.Reporter | None = None
    guard = auth.ListenGuard(settings.host)
    proxy = settings.proxy
    if settings.table_file is not None:
        holder.swap(table_mod.RouteTable.from_doc(json.loads(settings.table_file.read_text())))
        guard.check(holder.current.auth)
        source = str(settings.table_file)
    elif settings.control:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        following = watch.TableWatcher(settings.control, holder, listen_guard=guard, headers=headers,
                                       ssl_context=control_ssl)
        # Reports go where the table comes from: a control plane that answers now, not the
        # first one given, which may be the one that is down.
        name = settings.router_id or socket.gethostname()
        # Budgets and usage too: the quota and usage services of the control plane followed now.
        calls = usagehttp.ControlCalls(lambda: following.current_url, headers=headers, ssl_context=control_ssl)
        # kv_aware's view of the replicas' KV caches, from the same control plane's relay.
        metered["kv_view"] = kvview.KvView()
        feed = kvfeed.KvFeed(metered["kv_view"], lambda: following.current_url, headers=headers,
                             ssl_context=control_ssl)
        parts: list[app_mod.Lifecycle] = [following, calls, feed]
        if worker:
            # Stopped with the router, after the drain: its last push has every request's counts.
            pushes = metricspush.MetricsPush(name, lambda: following.current_url, headers=headers)
            parts.append(pushes)
            metered["metrics_source"] = pushes.scrape
        watcher = Together(*parts)
        metered |= {"quota": calls.quota, "usage": calls.usage, "usage_journal_dir": settings.usage_journal_dir,
                    "router_id": name, "tokenizer_fetch": calls.tokenizer}
        if static_hub:
            del metered["usage"], metered["usage_journal_dir"]
        else:
            # Batch lines run here; files and batches are the control plane's, passed to it (issue 32). A hub's
            # worker follows the hub, which passes them on (``hubfiles``), the worker proving itself in a header
            # of its own: Authorization is the client's.
            metered |= {"batches": calls, "batch_concurrency": proxy.batch_concurrency,
                        "batch_waiting_below": proxy.batch_waiting_below}
            files = controlpass.ControlPass(lambda: following.current_url, ssl_context=control_ssl,
                                            headers={hubfiles.WORKER_HEADER: token} if worker else None)
            watcher = Together(*parts, files)
            metered["files"] = files
            sink = reports.HttpSink(name, lambda: following.current_url, headers=headers, ssl_context=control_ssl)
            reporter = signals.Reporter(name, control_url=lambda: following.current_url, headers=headers,
                                        interval_s=proxy.signals_interval, ssl_context=control_ssl)
        urls = settings.control
        source = (f"the control plane at {urls[0]}" if len(urls) == 1
                  else f"the control planes at {', '.join(urls)}")
    else:
        raise ValueError("give a table file or a control-plane URL")
    # serve_metrics: alone, nothing else serves the router's metrics; its own app does.
    router = proxied(holder, proxy, watcher=watcher, source=source, serve_metrics=True, events=sink, signals=reporter,
                     **metered)
    if settings.control and not worker:  # issue 33: tunnelled engines through the control plane's tunnel port
        router.use_tunnels(tunnelremote.ControlTunnels(settings.control, token=token, ports=following.tunnel_ports,
                                                       ca_pem=lambda: holder.current.engine_ca))
    return router


class Together:
    """Several parts started in order and stopped in reverse, as one ``watcher``."""

    def __init__(self, *parts: app_mod.Lifecycle) -> None:
        self._parts = parts

    async def start(self) -> None:
        for part in self._parts:
            await part.start()

    async def stop(self) -> None:
        for part in reversed(self._parts):
            await part.stop()


def proxied(holder: table_mod.TableHolder, proxy: ProxySettings, **parts: Any) -> app_mod.RouterApp:
    """A RouterApp serving as ``proxy`` says, with ``parts`` (watcher, source, events, signals, serve_metrics)."""
    traced = tracing.Tracing(proxy.tracing_endpoint) if proxy.tracing_endpoint else None
    return app_mod.RouterApp(holder, max_body_bytes=proxy.max_body_bytes, keepalive_s=proxy.keepalive,
                             tracing=traced, admission_queue=proxy.admission_queue,
                             admission_wait_s=proxy.admission_wait, fair=proxy.admission_order == "fair", **parts)


def parser(file: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The standalone router's flags, one per field of ``RouterSettings``, and ``--config FILE``."""
    made = argparse.ArgumentParser(prog="python -m llmgw.router.standalone",
                                   description="Serve the OpenAI API, forwarding to engines.", allow_abbrev=False)
    made.add_argument("--config", metavar="FILE", type=Path, default=os.environ.get(CONFIG_ENV) or None,
                      help=f"a settings file (YAML): each setting by its name, e.g. `keepalive: 5`; a flag or a "
                           f"variable given beats it [env {CONFIG_ENV}]")
    settingsgen.add_arguments(made, RouterSettings, env=os.environ, file=file)
    return made


def parse_args(argv: list[str] | None = None) -> RouterSettings:
    """The settings the flags, the variables and the settings file give; a usage error (exit 2) naming what is wrong."""
    first, _ = parser().parse_known_args(argv)
    file: dict[str, Any] = {}
    if first.config is not None:
        try:
            file = settingsgen.from_mapping(RouterSettings, yaml.safe_load(first.config.read_text()), str(first.config))
        except (OSError, yaml.YAMLError, ValueError) as exc:
            parser().error(f"settings file: {exc}")
    made = parser(file)
    ns = made.parse_args(argv)
    if ns.table_file is None and not ns.control:
        made.error("one of the arguments --table-file --control is required")
    try:
        return settingsgen.from_namespace(RouterSettings, ns)
    except ValueError as exc:
        made.error(str(exc))
        raise   # not reached: error() exits


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


def run(settings: RouterSettings) -> int:
    """Serve as ``settings`` say until SIGTERM/SIGINT; the exit status."""
    hub_pid = _hub_pid(os.environ)
    # A worker's lines name it: its hub's log is theirs too (they share its stderr).
    who = f" [{settings.router_id}]" if hub_pid is not None else ""
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s")
    if hub_pid is None and settings.worker_count > 1:
        from llmgw.router import hub  # the workers' parent: only when there are workers

        return hub.run(settings)
    try:
        token = read_token(settings.token_file, os.environ) if settings.control else ""
    except ValueError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    if settings.control and not token:
        log.warning("no router credential (--token-file or %s): a secure control plane will refuse this router "
                    "its routes; `llmgw router-token create NAME` makes one", TOKEN_ENV)
    try:
        # Before anything is sent to the control plane: whom to trust (a wrong --control-ca-hash stops here).
        control_ssl = controltls.resolve(settings.control, ca_file=settings.control_ca,
                                         ca_hash=settings.control_ca_hash)
    except controltls.TrustError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    try:
        router = build(settings, token=token, static_hub=hub_pid is not None and os.environ.get(HUB_STATIC_ENV) == "1",
                       worker=hub_pid is not None, control_ssl=control_ssl)
    except (OSError, ValueError, table_mod.TableError) as exc:
        print(f"llmgw router: cannot load the route table: {exc}", file=sys.stderr)
        return 2
    # A worker of `llmgw server --router-workers` or of `llmgw router --workers N`'s hub: tunnelled engines (issue 33)
    # through its parent's relay; of the server, what is not the OpenAI API goes to the server.
    relay_at = os.environ.get(tunnelrelay.RELAY_ENV, "").strip() if hub_pid is not None else ""
    if relay_at:
        router.use_tunnels(tunnelrelay.RelayTunnels(relay_at, secret=token))
    passed_to = os.environ.get(passthrough.PASSTHROUGH_ENV, "").strip() if hub_pid is not None else ""
    front = passthrough.Passthrough(router, passed_to, secret=token) if passed_to else router
    try:
        tls = listener_tls(settings, warn=hub_pid is None)
    except tlslisten.TlsFilesError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # the stock loop works, at fewer requests per second
        run_loop = asyncio.run
    else:
        run_loop = uvloop.run
    try:
        return run_loop(serve(front, host=settings.host, port=settings.port,
                              max_body_bytes=settings.proxy.max_body_bytes, grace_s=settings.graceful_shutdown,
                              http_limits=settings.proxy.limits, source=settings.source, hub_pid=hub_pid, tls=tls,
                              marks=listener_marks(settings)))
    except KeyboardInterrupt:
        return 0


def listener_tls(settings: RouterSettings, *, warn: bool = True) -> tlslisten.CertReloader | None:
    """The listener's TLS (``--tls-cert/--tls-key``, checked now: TlsFilesError naming the flag), or None; warns
    when the router listens beyond loopback in plain HTTP without ``--plain-http`` saying a proxy is in front."""
    if settings.tls_cert is not None and settings.tls_key is not None:
        return tlslisten.CertReloader(settings.tls_cert, settings.tls_key)
    if warn and not settings.plain_http and not auth.is_loopback(settings.host):
        log.warning("PLAIN HTTP on %s: keys and prompts cross the network readable. Give --tls-cert/--tls-key to "
                    "serve HTTPS, or --plain-http when a TLS-terminating proxy is in front", settings.host)
    return None


def listener_marks(settings: RouterSettings) -> tuple[tuple[bytes, bytes], ...]:
    """The headers on every answer: HSTS on HTTPS, the plain-HTTP mark with ``--plain-http``."""
    if settings.tls_cert is not None:
        return (httphead.HSTS,)
    return (httphead.PLAIN_HTTP_MARK,) if settings.plain_http else ()


def _hub_pid(env: Mapping[str, str]) -> int | None:
    """The pid of the hub this process is a worker of (``HUB_PID_ENV``), None when it is not one."""
    value = env.get(HUB_PID_ENV, "")
    return int(value) if value.isdigit() else None


async def _orphaned(hub_pid: int, stop: asyncio.Event, every_s: float = 1.0) -> None:
    """Set ``stop`` once this worker's parent is no longer ``hub_pid`` (the hub died, even by kill -9)."""
    while not stop.is_set():
        if os.getppid() != hub_pid:
            log.warning("the hub (pid %d) is gone: stopping", hub_pid)
            stop.set()
            return
        await asyncio.sleep(every_s)


async def serve(router: app_mod.RouterApp | passthrough.Passthrough, *, host: str, port: int, max_body_bytes: int,
                grace_s: float, source: str, http_limits: limits.Limits | None = None,
                hub_pid: int | None = None, tls: tlslisten.CertReloader | None = None,
                marks: tuple[tuple[bytes, bytes], ...] = ()) -> int:
    """Open the pools, listen until SIGTERM/SIGINT, drain for ``grace_s``, close the pools.

    ``hub_pid``: this is a worker of that hub: it listens with SO_REUSEPORT beside the other workers, and
    stops as on SIGTERM once its parent is not that hub any more.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await router.startup()
    http = server_mod.Server(router, max_body_bytes=max_body_bytes, limits=http_limits or limits.Limits(),
                             marks=marks)
    orphan: asyncio.Task[None] | None = None
    watch_tls: asyncio.Task[None] | None = None
    try:
        try:
            await http.start(host, port, reuse_port=hub_pid is not None, ssl=tls.context if tls else None)
        except OSError as exc:
            print(f"llmgw router: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if tls is not None:
            watch_tls = asyncio.create_task(tls.run())   # a renewed certificate is served without a restart
        log.info("router on %s://%s:%d, routes from %s", "https" if tls else "http", host, port, source)
        if hub_pid is not None:
            orphan = asyncio.create_task(_orphaned(hub_pid, stop))
        await stop.wait()
        if orphan is not None:
            orphan.cancel()
        if watch_tls is not None:
            watch_tls.cancel()
        log.info("stopping: no new connections; open requests have %gs to finish", grace_s)
        await http.shutdown(grace_s)
    finally:
        await router.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
