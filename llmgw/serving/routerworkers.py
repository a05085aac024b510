"""``llmgw server --router-workers N``: N-1 router processes accepting on the server's HTTP port beside it.

The server keeps its listener and its in-process router on ``http_port`` (bound with SO_REUSEPORT when N > 1)
and starts N-1 router workers (``router.workers.Supervisor``: restarted when one exits, SIGTERM then SIGKILL at
the stop), each ``python -m llmgw.router.standalone`` listening on the same port, so the kernel spreads new
connections over the N processes. The server is their hub, as ``router.hub`` is for ``llmgw router --workers``,
on an internal listener of its own (127.0.0.1, a port the kernel picks) that only the workers may call: each is
given a random secret in its environment (``LLMGW_ROUTER_TOKEN``, never an argv), and any request without it
is answered 401 (``Internal``). On that listener:

- ``GET /api/v1/endpoints`` (``Authorization: Bearer SECRET``): the long poll, answered from this control plane's
  table (``Cluster.wait_table``, the document the REST API serves routers): one table, read in process;
- ``POST /api/v1/router/{usage,quota,events,signals}``: handed to this control plane's services in process, as
  the REST handlers do (``UsageService.ingest``/``sync``, ``RouterEvents.record``, the load signals): the
  ledger is the one the in-process router and every standalone router draw from, so limits and metering stay
  exact across the processes (``router.hub`` says why). Each worker is a router of its own, ``server-ID.wI``,
  with its own usage journal under the data directory;
- ``POST metricsmerge.PUSH_PATH?router=ID``: a worker's router metrics (``metricspush``), kept in the
  ``metricsmerge.Snapshots`` the server's ``/metrics`` sums with its in-process router's (``metricsmerge.Merged``
  in place of the router's registry, ``llmgw.serve``): the server's scrape has every process's requests;
- every other request, carrying the secret in ``passthrough.SECRET_HEADER``: a request a worker accepted that
  is not the OpenAI API (``router.passthrough``), served by the server's own front (REST, UI, mirror,
  ``/healthz``, ``/metrics``) with the client's address from ``passthrough.FORWARDED_FOR_HEADER`` as the
  request's client (login throttling and the audit log read it there). Both headers are taken out of every
  request arriving on the public port (``untrusting``), so only a worker can set them.

At the stop the workers get SIGTERM with the server's own listener, and as long (``GRACE_S``) to finish what is
open; the internal listener stays up until they exited, for their last usage and the passed requests' ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from llmgw.api.usage import QUOTA_PATH, USAGE_PATH, QuotaSync, UsageBatch
from llmgw.control.cluster import Cluster
from llmgw.control.routerreports import RouterEvents
from llmgw.control.tokenizerfiles import NoTokenizer
from llmgw.control.usage.service import UsageService
from llmgw.core import skew
from llmgw.core.version import version
from llmgw.router import asgi, hub, metricsmerge, passthrough, reports, signals, workers
from llmgw.router import server as router_server
from llmgw.router.settings import RouterSettings
from llmgw.serving.config import ServerConfig

log = logging.getLogger("llmgw.serve")

#: What open requests get to finish at a server's stop, in the server and in its workers alike.
GRACE_S = 3.0
_SECRET = passthrough.SECRET_HEADER.encode()
_FORWARDED = passthrough.FORWARDED_FOR_HEADER.encode()
_PROTO = passthrough.FORWARDED_PROTO_HEADER.encode()
_OURS = (_SECRET, _FORWARDED, _PROTO)
#: The headers the table's answer carries (``core.skew``), as ASGI takes them.
_SAID = [(k.lower().encode(), v.encode("latin-1")) for k, v in skew.headers(skew.PROTOCOL, version()).items()]
App = Callable[[asgi.Scope, asgi.Receive, asgi.Send], Awaitable[None]]


def untrusting(app: App) -> App:
    """``app`` for the public port: the headers only a worker may set are taken out of every request."""
    async def public(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        headers = scope.get("headers") or ()
        if any(name in _OURS for name, _ in headers):
            scope = {**scope, "headers": [(n, v) for n, v in headers if n not in _OURS]}
        await app(scope, receive, send)

    return public


@dataclasses.dataclass(frozen=True, slots=True)
class Services:
    """What the workers' hub calls answer from: this server's control plane."""

    cluster: Cluster
    reports: RouterEvents
    usage: UsageService
    #: The workers' router metrics, as they push them.
    metrics: metricsmerge.Snapshots = dataclasses.field(default_factory=metricsmerge.Snapshots)


def _header(scope: asgi.Scope, wanted: bytes) -> bytes | None:
    for name, value in scope.get("headers") or ():
        if name == wanted:
            return bytes(value)
    return None


class Internal:
    """The internal listener's app: passed requests to ``front``, the hub's calls to ``services``; ``secret`` only."""

    def __init__(self, secret: str, front: App, services: Services) -> None:
        self._secret = secret.encode()
        self._bearer = b"Bearer " + self._secret
        self._front = front
        self._services = services

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] != "http":
            return
        given = _header(scope, _SECRET)
        if given is not None and hmac.compare_digest(given, self._secret):
            await self._front(self._as_client_sent(scope), receive, send)
        elif given is None and hmac.compare_digest(asgi.authorization(scope) or b"", self._bearer):
            await self._hub(scope, receive, send)
        else:
            await _error(send, 401, "this is a server's internal listener, for its own router workers")

    @staticmethod
    def _as_client_sent(scope: asgi.Scope) -> asgi.Scope:
        """The passed request as its client sent it: without our headers, from the address the worker names, over
        the scheme it says (the session cookie is ``Secure`` on https)."""
        address = (_header(scope, _FORWARDED) or b"").decode("latin-1").strip()
        client = (address, 0) if address else scope.get("client")
        scheme = "https" if _header(scope, _PROTO) == b"https" else scope.get("scheme", "http")
        return {**scope, "client": client, "scheme": scheme,
                "headers": [(n, v) for n, v in scope["headers"] if n not in _OURS]}

    async def _hub(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        path, method = scope["path"], scope["method"]
        try:
            if path == "/api/v1/endpoints" and method == "GET":
                doc = await self._endpoints(scope)
            elif path == metricsmerge.PUSH_PATH and method == "POST":
                doc = self._metrics(scope, await asgi.read_body(receive, limit=64 << 20))
            elif path in hub.RELAYED and method == "POST":
                doc = await self._post(path, json.loads(await asgi.read_body(receive, limit=64 << 20)))
            elif path.startswith(hub.TOKENIZER_PATH) and method == "GET":
                model = unquote(path[len(hub.TOKENIZER_PATH):])
                doc = await self._tokenizer(model)
                if doc is None:
                    await _error(send, 404, f"model {model!r} offers no tokenizer files to routers (only a kv_aware "
                                            "model with an hf:// or mirror:// source does)")
                    return
            else:
                await _error(send, 404, f"no {method} {path} here")
                return
        except ValueError as exc:  # bad JSON, a bad query, a report the wire docs refuse (BadReport)
            await _error(send, 422, str(exc))
            return
        except asgi.ClientGone:
            return
        # The table's answer says this release's protocol, as the REST API's does: the workers check it (``watch``).
        await asgi.send_bytes(send, 200, json.dumps(doc).encode(), extra=_SAID if path == "/api/v1/endpoints" else None)

    def _metrics(self, scope: asgi.Scope, body: bytes) -> dict[str, Any]:
        router_id = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("router", [""])[0]
        if not router_id:
            raise ValueError("router: the pushing worker's router id is required")
        self._services.metrics.put(router_id, body.decode())  # ValueError: not an exposition
        return {}

    async def _endpoints(self, scope: asgi.Scope) -> dict[str, Any]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        after = int(query["after"][0]) if "after" in query else None
        timeout = min(max(float(query.get("timeout", ["25"])[0]), 0.0), hub.MAX_HOLD_S)
        loop = asyncio.get_running_loop()
        started = loop.time()
        table = await self._services.cluster.wait_table(after=after, timeout=timeout)
        left = timeout - (loop.time() - started)
        if table.version == after and left > 0:
            await asyncio.sleep(left)  # answered early, unchanged: the cluster is closing; no poll in a loop
        return table.to_doc()

    async def _tokenizer(self, model: str) -> dict[str, Any] | None:
        """A kv_aware model's tokenizer files, as ``GET /api/v1/router/tokenizer/{model}`` answers; None: none."""
        cluster = self._services.cluster
        if cluster.tokenizer_files is None or cluster.db is None:
            return None
        try:
            files = await cluster.tokenizer_files.for_model(cluster.db, model)
        except NoTokenizer:
            return None
        return files.to_doc()

    async def _post(self, path: str, doc: Any) -> dict[str, Any]:
        s = self._services
        if path == USAGE_PATH:
            return (await s.usage.ingest(UsageBatch.from_doc(doc))).to_doc()
        if path == QUOTA_PATH:
            return (await s.usage.sync(QuotaSync.from_doc(doc))).to_doc()
        if path == reports.EVENTS_PATH:
            return {"applied": s.reports.record(doc)}
        assert path == signals.SIGNALS_PATH, path
        return {"applied": s.cluster.signals.record(doc)}


async def _error(send: asgi.Send, status: int, message: str) -> None:
    await asgi.send_bytes(send, status, json.dumps({"error": {"message": message}}).encode())


class RouterWorkers:
    """The internal listener and the ``count - 1`` workers of a server with ``count`` router processes."""

    def __init__(self, cfg: ServerConfig, *, http_port: int, front: App, services: Services, router_id: str,
                 tls_files: tuple[Path, Path] | None = None) -> None:
        """``tls_files``: the certificate and key the HTTP port serves; each worker watches them itself."""
        self._cfg = cfg
        self._tls_files = tls_files
        self._http_port = http_port
        self._front = front
        self._services = services
        self._router_id = router_id
        self._internal: router_server.Server | None = None
        self._crew: workers.Supervisor | None = None
        self._private: Path | None = None

    @property
    def supervisor(self) -> workers.Supervisor | None:
        return self._crew

    async def start(self) -> None:
        cfg = self._cfg
        secret = secrets.token_urlsafe(32)
        # Every passed request comes from 127.0.0.1: no cap per address there (the workers applied the client's),
        # and no idle timeout: a worker's pooled connection closed as it sends on it would fail a client's request.
        self._internal = router_server.Server(
            Internal(secret, self._front, self._services), max_body_bytes=cfg.router.max_body_bytes,
            limits=dataclasses.replace(cfg.router.limits, max_per_address=0, idle_timeout_s=0.0))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        await self._internal.start_on(sock)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._private = Path(tempfile.mkdtemp(prefix="llmgw-server-workers-"))  # 0700
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        settings = RouterSettings(control=(url,), host=cfg.host, port=self._http_port, router_id=self._router_id,
                                  log_level=level if level in ("debug", "info", "warning", "error") else "info",
                                  graceful_shutdown=GRACE_S, workers=1, proxy=cfg.router,
                                  tls_cert=self._tls_files[0] if self._tls_files else None,
                                  tls_key=self._tls_files[1] if self._tls_files else None,
                                  plain_http=cfg.tls.marked_plain,
                                  usage_journal_dir=cfg.data_dir / "usage-journal-workers")
        configs = [workers.write_config(self._private, i, workers.worker_settings(settings, i, hub_url=url,
                                                                                  port=self._http_port))
                   for i in range(cfg.router_processes - 1)]
        env = workers.worker_env(os.environ, secret=secret, hub_pid=os.getpid()) | {passthrough.PASSTHROUGH_ENV: url}
        self._crew = workers.Supervisor(configs, env, grace_s=GRACE_S)
        self._crew.start()

    async def stop(self) -> None:
        """SIGTERM to the workers, up to the grace (and a little) for them to finish, then the internal listener."""
        try:
            if self._crew is not None:
                await self._crew.stop()
        finally:
            if self._internal is not None:
                await self._internal.shutdown(0.5)
            if self._private is not None:
                shutil.rmtree(self._private, ignore_errors=True)

