"""A standby control plane's REST front: answer what any instance can, forward the rest to the leader.

A standby shares the database with the leader but holds no agent streams, so node liveness, logs,
fabric tests and every change (which must pass the leader's fence and reach its reconcile loop)
live only on the leader. ``standby(app, leadership)`` wraps the REST app: while this instance leads
every request goes to ``app``; while it stands by, only what reads the shared database the same way
on any instance is answered here (health, metrics, the routers' endpoints document, the list of
control planes, and routers' usage and quota POSTs) and every other request is forwarded to the
leader's HTTP URL and its answer streamed back chunk by chunk, so ``llmgw events -f`` and
``llmgw logs -f`` work through a standby.

Forwarded: method, path, query string, body and the request headers that carry meaning for the
API (credentials, content negotiation, the CLI's audit actor); never ``Host`` (the leader's own
is set by the client) nor a hop-by-hop header. Answered: the leader's status and end-to-end
headers (``Set-Cookie`` repeated as sent), the body untouched (not decompressed), plus
``X-Llmgw-Forwarded-By: <this instance>``. No leader known, or the leader does not answer: 503
in the API's one error shape with ``Retry-After: 2`` and a sentence saying why, never a trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yarl
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw.control.auth import middleware as auth_mw
from llmgw.control.http.errors import error_body
from llmgw.control.leader import Instance, Me
from llmgw.control.store.store import Lease, StoredControlPlane

log = logging.getLogger(__name__)
FORWARDED_BY = "x-llmgw-forwarded-by"
#: Answered by a standby itself (GET and HEAD): each reads only the shared database (or nothing), the
#: same on every instance.
LOCAL_PATHS = frozenset({"/healthz", "/metrics", "/api/v1/endpoints", "/api/v1/controlplanes", "/api/v1/ca",
                         "/api/v1/ca.crt"})
#: POSTs a standby answers itself: a router's usage batches and quota syncs (issue 26) each write the shared
#: database in one transaction of their own (the journal's mark, the ledger's rows under a lock), the same on
#: every instance. Forwarded, they failed with the leader: a failover left every budget without a grant
#: until a new leader was elected, and its routers refused all traffic of keys with budgets meanwhile.
LOCAL_POSTS = frozenset({"/api/v1/router/usage", "/api/v1/router/quota",
                         # Batch lines claimed and answered (issue 32): conditional writes, the same on every instance.
                         "/api/v1/router/batch/claim", "/api/v1/router/batch/results"})
#: Request headers the API reads; nothing else is forwarded (``Host`` above all: the leader's is its own).
REQUEST_HEADERS = ("authorization", "cookie", "content-type", "accept", "accept-encoding", "origin", "user-agent",
                   "x-llmgw-actor")
#: Never forwarded either way (RFC 9110 7.6.1), with those a ``Connection`` header names; ``date``
#: because the server in front writes its own and two would reach the client.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade", "date"})
RETRY_AFTER_S = 2
#: The leader is on the same network: one that does not accept a connection in this long is down. No
#: total nor read timeout: ``llmgw logs -f`` and a long poll legitimately wait minutes between chunks.
CONNECT_TIMEOUT_S = 3.0


class View(Protocol):
    """What the forwarder reads of ``leader.Leadership`` (tests give a small class with the same)."""

    leading: bool
    me: Me
    lease: Lease | None  # as last read: who held it, at which term (for the 503's sentence)

    def leader(self) -> StoredControlPlane | None: ...

    def describe(self) -> list[Instance]: ...


class NoLeader(Exception):
    """No leader to forward to; the message is the sentence the 503 carries."""


def no_leader_message(view: View, *, failure: str = "") -> str:
    """Why a standby cannot answer now: whose lease expired and when it last wrote, or what the leader did not do."""
    return (f"this control plane ({view.me.id}) is a standby and no leader answers now ({failure or _why(view)}); "
            "retry in a few seconds")


def _why(view: View) -> str:
    lease = view.lease
    if lease is None:
        return "no control plane has taken the lease yet"
    holder = next((i for i in view.describe() if i.id == lease.holder), None)
    if holder is not None and holder.role == "leader":
        return f"{lease.holder} leads (term {lease.term}) but has not written an HTTP address to forward to"
    wrote = f"; it last wrote {holder.last_seen_s:.1f}s ago" if holder is not None else ""
    return f"the lease of {lease.holder} (term {lease.term}) expired and no standby has taken it yet{wrote}"


async def _respond_503(send: Send, message: str, *, me: str) -> None:
    data = json.dumps(error_body(message, type_="server_error", code="no_leader")).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"retry-after", str(RETRY_AFTER_S).encode()),
                            (FORWARDED_BY.encode(), me.encode("latin-1", "replace"))]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def _request_headers(scope: Scope, *, me: str, leader_url: str) -> list[tuple[str, str]]:
    raw = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
    out = [(name, raw[name]) for name in REQUEST_HEADERS if name in raw]
    # A browser on this standby's page sends its own origin, which the leader's CSRF check
    # (auth_mw.same_origin) compares with the leader's host and would refuse: the request is
    # same-origin where it was sent, so it is same-origin where it goes. Any other origin is
    # passed as it came and the leader judges it as it would judge it directly.
    if "origin" in raw and auth_mw.same_origin(raw):
        leader = urllib.parse.urlsplit(leader_url)
        out = [(n, f"{leader.scheme}://{leader.netloc}" if n == "origin" else v) for n, v in out]
    # The leader sees this standby as the peer; this says who called (for its logs; nothing trusts it).
    client = scope.get("client")
    if client:
        out.append(("x-forwarded-for", str(client[0])))
    # Marks the request: a standby that receives one already forwarded answers 503 rather than
    # forwarding again, so two instances that each think the other leads cannot bounce it forever.
    out.append((FORWARDED_BY, me))
    return out


def _response_headers(headers: Any, *, me: str) -> list[tuple[bytes, bytes]]:
    named = {t.strip().lower() for v in headers.getall("connection", ()) for t in v.split(",")}
    # aiohttp reads header values as UTF-8 with surrogateescape: encoded the same way, the bytes are the leader's.
    out = [(k.lower().encode("latin-1"), v.encode("utf-8", "surrogateescape")) for k, v in headers.items()
           if k.lower() not in HOP_BY_HOP and k.lower() not in named and k.lower() != FORWARDED_BY]
    out.append((FORWARDED_BY.encode(), me.encode("latin-1", "replace")))
    return out


class Standby:
    """The ASGI app ``standby()`` returns; owns the one HTTP client session that talks to the leader."""

    def __init__(self, app: ASGIApp, view: View, *, ca_file: Path | None = None) -> None:
        self.app, self.view = app, view
        self._session: aiohttp.ClientSession | None = None
        # A leader serving HTTPS is verified: the system's roots (an operator's public certificate) and the cluster CA.
        self._ssl: ssl.SSLContext | None = None
        if ca_file is not None:
            self._ssl = ssl.create_default_context()
            self._ssl.load_verify_locations(cafile=str(ca_file))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Made on first use, inside the running loop. auto_decompress off: the body passes as the
            # leader encoded it, with its Content-Encoding and Content-Length still true of it.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None)
        return self._session

    async def close(self) -> None:
        """Closes the client session (at the server's stop; aiohttp warns of an unclosed session otherwise)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or self.view.leading
                or (scope.get("method") in ("GET", "HEAD") and scope.get("path", "") in LOCAL_PATHS)
                or (scope.get("method") == "POST" and scope.get("path", "") in LOCAL_POSTS)):
            await self.app(scope, receive, send)
            return
        me = self.view.me.id
        if any(k.lower() == FORWARDED_BY.encode() for k, _ in scope.get("headers", ())):
            await _respond_503(send, no_leader_message(self.view, failure="the request was already forwarded "
                                                        "to it by another standby: the two disagree on who leads"),
                               me=me)
            return
        leader = self.view.leader()
        if leader is None or not leader.http_url:
            await _respond_503(send, no_leader_message(self.view), me=me)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            await self._forward(scope, bytes(body), receive, send, leader=leader, me=me)
        except NoLeader as e:
            await _respond_503(send, str(e), me=me)

    async def _forward(self, scope: Scope, body: bytes, receive: Receive, send: Send, *,
                       leader: StoredControlPlane, me: str) -> None:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        url = leader.http_url.rstrip("/") + raw_path.decode("latin-1")
        if query:
            url += "?" + query.decode("latin-1")
        try:
            response = await self._client().request(
                scope["method"], yarl.URL(url, encoded=True), data=body or None,
                headers=_request_headers(scope, me=me, leader_url=leader.http_url),
                allow_redirects=False, skip_auto_headers=("Content-Type",))
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            said = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise NoLeader(no_leader_message(self.view, failure=f"its leader {leader.id} at {leader.http_url} did "
                                                                f"not answer: {said}")) from None
        async with response:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": _response_headers(response.headers, me=me)})
            await self._relay(response, receive, send, leader=leader)

    async def _relay(self, response: aiohttp.ClientResponse, receive: Receive, send: Send, *,
                     leader: StoredControlPlane) -> None:
        """The body chunk by chunk as it arrives; a client that leaves closes the leader's stream at once."""

        async def pump() -> bool:
            try:
                async for chunk in response.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                # Returning without the last chunk makes the server close the connection, so the
                # client sees a cut stream, not a clean end it would take for the whole answer.
                log.warning("the leader %s stopped answering mid-response (%s); the client's answer is cut",
                            leader.id, str(e) or type(e).__name__)
                return False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return True

        async def gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        relay, watch = asyncio.ensure_future(pump()), asyncio.ensure_future(gone())
        try:
            await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, watch):
                task.cancel()
            for task in (relay, watch):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


def standby(app: ASGIApp, leadership: View, *, ca_file: Path | None = None) -> Standby:
    """``app`` while ``leadership.leading``; on a standby, the local routes from ``app``, the rest from the leader
    (over https:// verified with ``ca_file``, the cluster CA, when the leader's URL says https)."""
    return Standby(app, leadership, ca_file=ca_file)


