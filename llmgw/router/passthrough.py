"""A router worker of ``llmgw server --router-workers N``: the OpenAI API served here, every other request passed on.

The server's workers accept on the server's own HTTP port (SO_REUSEPORT), so a connection for the REST API,
the admin UI, the mirror, ``/healthz`` or ``/metrics`` lands on a worker as often as on the server. A worker
answers ``/v1/...`` itself (``RouterApp``, as the server's in-process router does) and passes everything else
(``/v1/files`` and ``/v1/batches`` too: the control plane serves them, issue 32)
to the server over its loopback internal listener (``serving.routerworkers``), whose URL it is given in
``PASSTHROUGH_ENV``:

- the method, the path and query as received, the body, and the headers but the hop-by-hop ones
  (``HOP_BY_HOP``) and the two the server reads on that listener, which a client never sets: the hub's
  secret (``SECRET_HEADER``, the worker's ``LLMGW_ROUTER_TOKEN``) and the client's address
  (``FORWARDED_FOR_HEADER``), which the server then takes as the request's client (login throttling, the
  audit log) from a caller holding the secret only;
- the answer streamed back as it comes: status, headers (but hop-by-hop ones and ``date``, which this
  server writes), and each chunk of the body as the server sends it (a follow stream, a mirror download,
  SSE are never buffered). A client that leaves closes the request to the server at once.

Only in this mode: a worker of ``llmgw router --workers`` has no server behind it and keeps answering 404.
"""

from __future__ import annotations

import logging

import aiohttp
import yarl
from multidict import CIMultiDict

from llmgw.api.batches import openai_path
from llmgw.router import app as app_mod
from llmgw.router import asgi, errors

log = logging.getLogger("llmgw.router.passthrough")

#: Set in a server's router worker's environment: the server's internal listener, http://127.0.0.1:PORT.
#: Not a setting (no ``LLMGW_ROUTER_`` prefix): only the server gives it.
PASSTHROUGH_ENV = "LLMGW_PASSTHROUGH_URL"
#: The hub's secret on a passed request (its ``Authorization`` is the client's own).
SECRET_HEADER = "x-llmgw-internal"
#: The address of the client a passed request came from.
FORWARDED_FOR_HEADER = "x-llmgw-forwarded-for"
#: The scheme the client used (``https`` on a TLS listener), so the server sets ``Secure`` cookies as it would.
FORWARDED_PROTO_HEADER = "x-llmgw-forwarded-proto"
#: Headers that concern one connection only (RFC 9110 7.6.1), never passed on; ``expect`` was answered here.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection",
                        "proxy-authenticate", "proxy-authorization", "te", "trailer", "expect"})
_NOT_PASSED = HOP_BY_HOP | {SECRET_HEADER, FORWARDED_FOR_HEADER, FORWARDED_PROTO_HEADER}
_NOT_RETURNED = HOP_BY_HOP | {"date"}
#: aiohttp would add these when the client sent none (an Accept-Encoding the client never asked for).
_NO_AUTO = ("Accept-Encoding", "User-Agent", "Content-Type")


def passed_headers(headers: list[tuple[bytes, bytes]], *, secret: str, client: str,
                   scheme: str = "http") -> CIMultiDict[str]:
    """The headers a passed request carries: the client's but hop-by-hop and ours, then the secret, the address
    and the scheme."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers:
        key = name.decode("latin-1").lower()
        if key not in _NOT_PASSED:
            out.add(key, value.decode("latin-1"))
    out[SECRET_HEADER] = secret
    if client:
        out[FORWARDED_FOR_HEADER] = client
    out[FORWARDED_PROTO_HEADER] = scheme
    return out


def returned_headers(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    """The server's answer's headers as the client gets them: but hop-by-hop ones and ``date``."""
    return [(name.lower(), value) for name, value in raw if name.decode("latin-1").lower() not in _NOT_RETURNED]


class Passthrough:
    """``router`` for ``/v1/...``; every other request passed to the server at ``url`` with ``secret``."""

    def __init__(self, router: app_mod.RouterApp, url: str, *, secret: str) -> None:
        self.router = router
        self._base = url.rstrip("/")
        self._secret = secret
        self._session: aiohttp.ClientSession | None = None

    async def startup(self) -> None:
        # No total timeout: a follow stream runs as long as its client reads it; the server bounds the rest.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=5.0), auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, force_close=False))
        await self.router.startup()

    async def shutdown(self) -> None:
        await self.router.shutdown()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] != "http" or (scope["path"].startswith("/v1/") and not openai_path(scope["path"])):
            await self.router(scope, receive, send)
        else:
            await self.pass_on(scope, receive, send)

    async def pass_on(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        assert self._session is not None, "startup() first"
        try:
            body = await asgi.read_body(receive, limit=1 << 62)  # the HTTP server bounded it already
        except asgi.ClientGone:
            return
        client = scope.get("client")
        target = self._base + scope["raw_path"].decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = passed_headers(scope.get("headers", []), secret=self._secret, client=client[0] if client else "",
                                 scheme=scope.get("scheme", "http"))
        try:
            resp = await self._session.request(scope["method"], yarl.URL(target, encoded=True), headers=headers,
                                               data=body or None, allow_redirects=False, skip_auto_headers=_NO_AUTO)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("the server's internal listener did not answer %s %s: %s", scope["method"], scope["path"],
                        str(exc) or type(exc).__name__)
            error = errors.ApiError(502, "This server's router worker could not reach the server; retry.",
                                    type="service_unavailable", code="server_unreachable")
            await asgi.send_bytes(send, 502, error.body())
            return
        async with resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": returned_headers(resp.raw_headers)})
            if scope["method"] != "HEAD":
                try:
                    async for chunk in resp.content.iter_any():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except (aiohttp.ClientError, TimeoutError) as exc:
                    # The client's answer is cut: returning mid-response closes its connection.
                    log.warning("the server stopped answering %s %s mid-response: %s", scope["method"],
                                scope["path"], str(exc) or type(exc).__name__)
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})

