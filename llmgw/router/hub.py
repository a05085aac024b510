"""``llmgw router --workers N``: the hub, a control plane for the router's own workers (issue 27).

With ``--workers`` other than 1 the process started serves no OpenAI request itself. It follows the
control plane once (``watch.TableWatcher``, with the router's credential), or reads the ``--table-file``,
and serves on 127.0.0.1, on a port of its own, the router-facing part of the control plane's API to
its workers (``workers.Supervisor`` runs them: ``python -m llmgw.router.standalone --control
http://127.0.0.1:HUBPORT``, the ordinary router), each of which listens on the public port with
SO_REUSEPORT, so the kernel spreads connections over them:

- ``GET /api/v1/endpoints?after=V&timeout=T``: the long poll, answered from the document the hub last
  received (``Feed``). The version is the hub's own, bumped when the document changes: one subscription
  upstream, fanned out, and a failover between control planes (whose versions are each their own) costs
  the workers nothing.
- ``GET /api/v1/router/kv`` (the KV block sets ``kv_aware`` reads) and
  ``POST /api/v1/router/{usage,quota,signals,events}``: relayed to the control plane followed now
  (``current_url``), with the hub's credential, its answer (status and body) handed back (``Relay``).
  Each worker is a router of its own to the control plane, ``ROUTER_ID.wI``: its usage journal, its
  quota leases and its load reports are its own (the control plane merges load reports per router
  and applies each journal's records once).

Why limits stay exact across workers: ``core.quota``'s bound does not depend on how many routers hold
leases. Requests and concurrency take a unit out of a lease before a request is sent, and the control
plane grants only out of ``limit - charged - held by all``, so however many workers hold leases none
passes the limit; tokens and spend overshoot only by what requests in flight use beyond their
reservations, the same error as with one router. A worker is one more lease holder, no more.

Over a static table there is no control plane, and each worker's own rpm/tpm window (``ratelimit``)
would multiply a key's limits by N. So the hub answers ``quota`` and ``usage`` itself from an in-memory
``ledger.Ledger`` holding the table's key and project limits (rpm/tpm as requests/tokens per minute,
``budgets.with_minute``): the workers admit from leases as routers of a control plane do, and the
limits hold across them (per UTC minute, where one router alone keeps a sliding minute). Load reports
and events have no one to go to there and are answered 200 and dropped.

Only the workers may call: each is given a random bearer secret through ``LLMGW_ROUTER_TOKEN`` (its
environment, never its argv); any other caller is answered 401.

``/metrics`` through the public port is every worker's sum, whichever worker accepted the scrape: each worker
pushes its metrics here (``POST metricsmerge.PUSH_PATH?router=ID``, every ``metricsmerge.PUSH_INTERVAL_S`` and
at its stop), the hub keeps the latest of each (``metricsmerge.Snapshots``: a restarted worker's replace its old
one, a worker silent for ``metricsmerge.STALE_S`` is dropped) and answers ``GET metricsmerge.MERGED_PATH`` with
their sum, which a worker's ``/metrics`` serves (``metricspush``). So a scrape lags the requests by up to one
push interval.

Tunnelled engines (issue 33): the hub learns the control plane's tunnel port (``Upstream.tunnel_ports``) and runs
a relay for its workers on 127.0.0.1 (``tunnel.remote.workers_relay``, their secret; ``relay.RELAY_ENV`` in their
environment) that opens each stream on that port with the hub's router token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from llmgw.api import batches as batchwire
from llmgw.api import usage as wire
from llmgw.core import skew
from llmgw.core.version import version
from llmgw.router import controltls, hubfiles, metricsmerge, reports, signals, watch, workers
from llmgw.router import table as table_mod
from llmgw.router.hubledger import LocalLedger, table_limits
from llmgw.router.hubledger import error as _error
from llmgw.router.settings import RouterSettings
from llmgw.router.tunnel import relay as tunnelrelay
from llmgw.router.tunnel import remote as tunnelremote

log = logging.getLogger("llmgw.router.hub")

#: The paths a router posts to the control plane it follows.
RELAYED = (wire.USAGE_PATH, wire.QUOTA_PATH, signals.SIGNALS_PATH, reports.EVENTS_PATH, batchwire.CLAIM_PATH,
           batchwire.RESULTS_PATH)
#: A kv_aware model's tokenizer files (``router.tokenizers``): a GET, relayed as the POSTs are (a static table: none).
TOKENIZER_PATH = "/api/v1/router/tokenizer/"
#: The longest a worker's long poll is held, whatever it asks.
MAX_HOLD_S = 60.0
RELAY_TIMEOUT_S = 10.0
_EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


class Feed:
    """The table document the workers get: the last one received, under a version of the hub's own."""

    def __init__(self) -> None:
        self.version = 0  # 0: none yet
        self._doc: dict[str, Any] | None = None
        self._changed = asyncio.Event()

    def publish(self, doc: Mapping[str, Any]) -> bool:
        """Take ``doc`` (an endpoints document); True when it differs from the last beyond its version."""
        content = {k: v for k, v in doc.items() if k != "version"}
        if self._doc is not None and content == {k: v for k, v in self._doc.items() if k != "version"}:
            return False
        self.version += 1
        self._doc = {**content, "version": self.version}
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    async def wait(self, after: int, timeout: float) -> dict[str, Any] | None:
        """The document, at once unless its version is ``after`` (or there is none): then within ``timeout``."""
        if self._doc is None or self.version == after:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return self._doc


class Upstream(watch.TableWatcher):
    """A ``TableWatcher`` that hands each document it reads to ``feed`` as it is."""

    def __init__(self, urls: tuple[str, ...], feed: Feed, *, headers: Mapping[str, str],
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(urls, table_mod.TableHolder(), headers=headers, ssl_context=ssl_context)
        self._feed = feed
        self._doc: Mapping[str, Any] = {}

    async def _poll(self, base_url: str) -> object:
        doc = await super()._poll(base_url)
        self._doc = doc if isinstance(doc, Mapping) else {}
        return doc

    def _install(self, table: table_mod.RouteTable) -> None:
        super()._install(table)  # only a document that is a table: a bad one never reaches the workers
        self._feed.publish(self._doc)

    def engine_ca(self) -> str:
        """The cluster CA the last table carried: the tunnel port's certificate is verified with it."""
        return self._holder.current.engine_ca


Handler = Callable[[str, bytes], Awaitable[web.Response]]


class Relay:
    """A worker's POST, sent on to the control plane followed now with the hub's credential."""

    def __init__(self, control_url: Callable[[], str], *, headers: Mapping[str, str],
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._control_url = control_url
        self._ssl = ssl_context
        self._headers = {**headers, "Content-Type": "application/json"}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = controltls.session(self._ssl, timeout=aiohttp.ClientTimeout(total=RELAY_TIMEOUT_S))

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, path: str) -> web.Response:
        """A worker's GET of ``TOKENIZER_PATH``, sent on as the POSTs are."""
        return await self.__call__(path, None)

    async def __call__(self, path: str, body: bytes | None) -> web.Response:
        assert self._session is not None
        url = self._control_url().rstrip("/") + path
        try:
            async with self._session.request("GET" if body is None else "POST", url, data=body,
                                             headers=self._headers) as resp:
                return web.Response(status=resp.status, body=await resp.read(),
                                    content_type=resp.content_type or "application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The worker's own failure path follows: the journal sends again, budgets fail closed.
            return _error(502, f"the control plane at {url} did not answer: {str(exc) or type(exc).__name__}")

    async def kv(self, query: str) -> web.Response:
        """A worker's long poll of the KV block sets (``kv_aware``), sent on as it came (its own version and origin)."""
        assert self._session is not None
        url = self._control_url().rstrip("/") + "/api/v1/router/kv?" + query
        try:
            async with self._session.get(url, headers=self._headers,
                                         timeout=aiohttp.ClientTimeout(total=MAX_HOLD_S + RELAY_TIMEOUT_S)) as resp:
                return web.Response(status=resp.status, body=await resp.read(),
                                    content_type=resp.content_type or "application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error(502, f"the control plane at {url} did not answer: {str(exc) or type(exc).__name__}")


#: What the hub says of itself to its workers' table requests (``core.skew``): this release.
_SAID = skew.headers(skew.PROTOCOL, version())


def app(secret: str, feed: Feed, calls: Handler, snapshots: metricsmerge.Snapshots | None = None,
        files: hubfiles.FilesPass | None = None) -> web.Application:
    """The workers' API: the long poll on ``feed``, the router's POSTs handed to ``calls``, the workers' metrics
    kept in ``snapshots`` and served summed, clients' files and batches passed by ``files``; for ``secret`` only."""
    kept = snapshots if snapshots is not None else metricsmerge.Snapshots()
    expected = f"Bearer {secret}".encode()

    @web.middleware
    async def only_workers(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if batchwire.openai_path(request.path):  # the client's Authorization; the secret in its own header
            given = b"Bearer " + request.headers.get(hubfiles.WORKER_HEADER, "").encode()
        if not hmac.compare_digest(given, expected):
            return _error(401, "this is a router hub's API for its own workers")
        return await handler(request)

    async def endpoints(request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "-1"))
            timeout = min(max(float(request.query.get("timeout", "30")), 0.0), MAX_HOLD_S)
        except ValueError:
            return _error(400, "after: expected an integer; timeout: expected seconds")
        doc = await feed.wait(after, timeout)
        if doc is None:
            return _error(503, "the hub has no route table yet")
        # Its workers are its own release: the hub answers as a control plane of it (they check it, ``watch``).
        return web.json_response(doc, headers=_SAID)

    async def post(request: web.Request) -> web.Response:
        return await calls(request.path, await request.read())

    async def push(request: web.Request) -> web.Response:
        router_id = request.query.get("router", "")
        if not router_id:
            return _error(400, "router: the pushing worker's router id is required")
        try:
            kept.put(router_id, (await request.read()).decode())
        except ValueError as exc:  # not an exposition (UnicodeDecodeError is one)
            return _error(400, f"not Prometheus text: {exc}")
        return web.json_response({})

    async def merged(request: web.Request) -> web.Response:
        return web.Response(body=kept.merged(), headers={"Content-Type": _EXPOSITION})

    async def tokenizer(request: web.Request) -> web.Response:
        if isinstance(calls, Relay):
            return await calls.get(request.path_qs)
        return _error(404, "a router serving a table file offers no tokenizer files: kv_aware falls back for text")

    made = web.Application(middlewares=[only_workers], client_max_size=64 << 20)
    made.router.add_post(metricsmerge.PUSH_PATH, push)
    made.router.add_get(metricsmerge.MERGED_PATH, merged)
    made.router.add_get("/api/v1/endpoints", endpoints)
    made.router.add_get(TOKENIZER_PATH + "{model}", tokenizer)
    if isinstance(calls, Relay):  # over a static table there is no relay: a worker's kv_aware falls back
        relayed = calls
        made.router.add_get("/api/v1/router/kv", lambda request: relayed.kv(request.query_string))
    for path in RELAYED:
        made.router.add_post(path, post)
    if files is not None:
        files.add_routes(made)
    return made


def hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT, never listening: it chooses the port when ``port`` is 0,
    and holds it for the hub's life (the workers bind beside it); OSError when the port is taken."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def run(settings: RouterSettings) -> int:
    """Run the hub and ``settings.worker_count`` workers until SIGTERM/SIGINT; the exit status."""
    try:
        token = read_token(settings) if settings.control else ""
        doc = json.loads(settings.table_file.read_text()) if settings.table_file is not None else None
        limits = table_limits(doc) if doc is not None else {}
    except (OSError, ValueError, table_mod.TableError) as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    if settings.control and not token:
        log.warning("no router credential (--token-file or LLMGW_ROUTER_TOKEN): a secure control plane will refuse "
                    "this router its routes; `llmgw router-token create NAME` makes one")
    from llmgw.router import standalone, tlslisten

    try:   # the listener's certificate checked (and plain HTTP beyond loopback warned) once, here, not per worker
        standalone.listener_tls(settings)
    except tlslisten.TlsFilesError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    try:
        # Before the token goes anywhere: whom to trust (a wrong --control-ca-hash stops the hub here).
        control_ssl = controltls.resolve(settings.control, ca_file=settings.control_ca,
                                         ca_hash=settings.control_ca_hash) if settings.control else None
    except controltls.TrustError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    try:
        held = hold_port(settings.host, settings.port)
    except OSError as exc:
        print(f"llmgw router: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(settings, token, doc, limits, held.getsockname()[1], control_ssl))
    except KeyboardInterrupt:
        return 0
    finally:
        held.close()


def read_token(settings: RouterSettings) -> str:
    from llmgw.router import standalone

    return standalone.read_token(settings.token_file, os.environ)


async def _serve(settings: RouterSettings, token: str, doc: Mapping[str, Any] | None,
                 limits: dict[tuple[str, str], int], port: int, control_ssl: ssl.SSLContext | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    feed = Feed()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    upstream: Upstream | None = None
    files: hubfiles.FilesPass | None = None
    calls: Handler
    if doc is not None:
        feed.publish(doc)
        calls = LocalLedger(limits)
    else:
        upstream = Upstream(settings.control, feed, headers=headers, ssl_context=control_ssl)
        relay = Relay(lambda: upstream.current_url if upstream is not None else "", headers=headers,
                      ssl_context=control_ssl)
        calls = relay
        files = hubfiles.FilesPass(lambda: upstream.current_url if upstream is not None else "",
                                   ssl_context=control_ssl)
        await relay.start()
        await upstream.start()
    secret = secrets.token_urlsafe(32)
    runner = web.AppRunner(app(secret, feed, calls, files=files), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.SockSite(runner, _loopback_socket())
    await site.start()
    hub_port = runner.addresses[0][1]
    private = Path(tempfile.mkdtemp(prefix="llmgw-router-hub-"))  # 0700
    env = workers.worker_env(os.environ, secret=secret, hub_pid=os.getpid(), static=settings.table_file is not None)
    env.pop(tunnelrelay.RELAY_ENV, None)  # only this hub's relay, never one inherited
    tunnels = None if upstream is None else tunnelremote.workers_relay(
        settings.control, token=token, ports=upstream.tunnel_ports, ca_pem=upstream.engine_ca, secret=secret)
    try:
        if tunnels is not None:
            env[tunnelrelay.RELAY_ENV] = await tunnels.start()
        n = settings.worker_count
        configs = [workers.write_config(private, i, workers.worker_settings(
            settings, i, hub_url=f"http://127.0.0.1:{hub_port}", port=port)) for i in range(n)]
        crew = workers.Supervisor(configs, env, grace_s=settings.graceful_shutdown)
        crew.start()
        log.info("router on http://%s:%d with %d workers (hub pid %d), routes from %s", settings.host, port, n,
                 os.getpid(), settings.source)
        await stop.wait()
        log.info("stopping: SIGTERM to %d workers; open requests have %gs to finish", n, settings.graceful_shutdown)
        await crew.stop()
    finally:
        shutil.rmtree(private, ignore_errors=True)
        if tunnels is not None:
            await tunnels.stop()
        if upstream is not None:
            await upstream.stop()
        await runner.cleanup()
        if isinstance(calls, Relay):
            await calls.stop()
        if files is not None:
            await files.stop()
    return 0


def _loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock
