"""The audit log over REST: every mutating route recorded in one place, and ``GET /api/v1/audit`` to read it.

``AuditMiddleware`` wraps the whole app, so a handler cannot forget to record
itself: each request whose method and path match ``AUDITED`` is written to the
store's ``audit`` table with its actor, action, object and outcome (ok for 2xx,
refused for 4xx with the error's message, failed for 5xx or an exception). A
new mutating route that is neither in ``AUDITED`` nor in ``NOT_AUDITED`` fails
``tests/unit/test_audit_log.py``, which enumerates the app's routes.

The actor is the principal the auth middleware proved (``user:admin``,
``router:r1``, ``insecure``), followed by what the CLI says in ``X-Llmgw-Actor``
(its local user; under sudo ``sudo:<SUDO_USER>``) and the peer's address:
``user:admin (sudo:alice@127.0.0.1)``. That header is informational only: anyone
can send any value, so nothing is allowed or refused by it; the principal is what
was proved and the address is what the server itself saw. A login proves its
user only if it succeeds: a refused one's actor is the claim and the address,
its object the username it tried.

What is never recorded: a request's body, and a response's (a key create's
answer carries its secret). The object's name is read out of them and nothing
else is kept.

Refusals that come in floods are counted, not listed: a rate-limited login (429) adds to one row per
address and minute (``auditcount.RefusalCounts``). The log is kept for ``--audit-retention`` (90 days by
default) and pruned by the leader (``auditprune``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from typing import Any

from fastapi import APIRouter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw.control.auth.middleware import PRINCIPAL
from llmgw.control.http import auditcount, paging, schemas
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import AuditEntry

log = logging.getLogger(__name__)
#: The CLI's claim of who runs it (its local user); informational, never a credential.
ACTOR_HEADER = "x-llmgw-actor"
#: Bodies read for an object's name (or a refusal's message) past this are not kept: the name is near the top.
_KEEP_BODY = 1 << 20
_DETAIL_MAX = 500
_CLAIM = re.compile(r"[^A-Za-z0-9._@:+-]")


@dataclasses.dataclass(frozen=True, slots=True)
class Audited:
    """A mutating route: its method, its path, the action it is recorded as, and its object's kind."""

    method: str
    path: re.Pattern[str]
    action: str
    kind: str  # "model", "node", "key": the object is "{kind}/{name}"


def _route(method: str, path: str, action: str, kind: str) -> Audited:
    return Audited(method, re.compile(path.replace("{name}", "(?P<name>[^/]+)") + "$"), action, kind)


AUDITED: tuple[Audited, ...] = (
    _route("POST", "/api/v1/models", "apply", "model"),  # the name is in the body
    _route("PUT", "/api/v1/models/{name}", "apply", "model"),
    _route("DELETE", "/api/v1/models/{name}", "delete", "model"),
    _route("POST", "/api/v1/models/{name}/scale", "scale", "model"),
    _route("POST", "/api/v1/adapters", "apply", "adapter"),  # the name is in the body
    _route("DELETE", "/api/v1/adapters/{name}", "delete", "adapter"),
    _route("POST", "/api/v1/nodes/{name}/cordon", "cordon", "node"),
    _route("POST", "/api/v1/nodes/{name}/uncordon", "uncordon", "node"),
    _route("POST", "/api/v1/nodes/{name}/drain", "drain", "node"),
    _route("POST", "/api/v1/nodes/{name}/revoke", "revoke", "node"),
    _route("POST", "/api/v1/nodes/{name}/upgrade", "upgrade", "node"),
    _route("POST", "/api/v1/fabric/tests", "fabric test", "fabric"),  # runs a tool on two nodes
    _route("POST", "/api/v1/keys", "key create", "key"),  # the id is in the answer
    _route("POST", "/api/v1/tokens", "token create", "token"),  # a join token: its id (public half) is in the answer
    _route("DELETE", "/api/v1/keys/{name}", "key delete", "key"),
    _route("POST", "/api/v1/keys/{name}/disable", "key disable", "key"),
    _route("POST", "/api/v1/keys/{name}/enable", "key enable", "key"),
    _route("PATCH", "/api/v1/keys/{name}", "key update", "key"),
    _route("POST", "/api/v1/projects", "project create", "project"),  # the name is in the body
    _route("DELETE", "/api/v1/projects/{name}", "project delete", "project"),
    _route("PUT", "/api/v1/projects/{name}/members", "project member set", "project"),
    _route("DELETE", "/api/v1/projects/{name}/members/[^/]+", "project member remove", "project"),
    _route("PUT", "/api/v1/projects/{name}/limits", "project set-limits", "project"),
    _route("PUT", "/api/v1/projects/{name}/priority", "project set-priority", "project"),
    _route("PUT", "/api/v1/keys/{name}/priority", "key set-priority", "key"),
    _route("POST", "/api/v1/users", "user create", "user"),  # the name is in the body
    _route("PUT", "/api/v1/users/{name}", "user change", "user"),
    _route("DELETE", "/api/v1/users/{name}", "user delete", "user"),
    _route("POST", "/api/v1/routers", "router create", "router"),
    _route("DELETE", "/api/v1/routers/{name}", "router delete", "router"),
    _route("POST", "/api/v1/login", "login", "user"),  # failures above all: a brute force shows here
    _route("POST", "/api/v1/logout", "logout", "user"),
    # The object, "engine/vllm 0.32.0 on node05" (or "on pool gpu"), is read from the body.
    _route("POST", "/api/v1/engines", "engine want", "engine"),
    _route("DELETE", "/api/v1/engines", "engine unwant", "engine"),
    _route("POST", "/api/v1/engines/remove", "engine remove", "engine"),
    # The object names the keys that changed ("settings/allow_remote_code"), read from the answer.
    _route("PUT", "/api/v1/settings", "settings set", "settings"),
)
#: Mutating routes deliberately not audited, each with why.
NOT_AUDITED: dict[tuple[str, str], str] = {
    ("POST", "/api/v1/preview"): "a dry run: it applies, stores and sends nothing (its apply is audited)",
    ("POST", "/api/v1/router/events"): "a router's report of what it saw (ejections), many a minute; it changes "
                                       "no desired state, and the events log keeps it",
    ("POST", "/api/v1/router/signals"): "a router's load report, every 2 s from each router; it changes no desired "
                                        "state, and each change of count it leads to is an Autoscaled event",
    ("POST", "/api/v1/router/usage"): "a router's metered requests, every few seconds from each router; the usage "
                                      "rollups are their record",
    ("POST", "/api/v1/sso/begin"): "a sign-in begun changes nothing; its end (or refusal) is audited by the SSO "
                                   "service",
    ("POST", "/api/v1/sso/finish"): "the SSO service records each sign-in and each refusal itself, with its reason "
                                    "(control.sso.audit)",
    ("POST", "/api/v1/sso/device"): "a device sign-in begun changes nothing; its end (or refusal) is audited by the "
                                    "SSO service",
    ("POST", "/api/v1/sso/device/token"): "polled every few seconds until approved: the SSO service records the "
                                          "sign-in or its refusal once, not each 'pending'",
    ("POST", "/api/v1/router/batch/claim"): "a router's claim of batch lines, every second or so from each router; "
                                            "the batch's lines keep who holds them",
    ("POST", "/api/v1/router/batch/results"): "a router's answers to batch lines; the batch's output file is their "
                                              "record",
    ("POST", "/api/v1/router/quota"): "a router's quota sync, every second or so from each router; a budget's "
                                      "thresholds are audited as they are crossed",
}


def audited(method: str, path: str) -> Audited | None:
    """The audited route a request is, or None."""
    for a in AUDITED:
        if a.method == method and a.path.match(path):
            return a
    return None


def actor(claimed: str, peer: str, *, principal: str = "") -> str:
    """``principal (claimed@peer)``, without a principal ``claimed@peer``, without a claim the peer alone.

    The claim is cut to a name's characters so it cannot forge a line.
    """
    claim = _CLAIM.sub("", claimed)[:64]
    peer = peer or "unknown"
    where = f"{claim}@{peer}" if claim else peer
    return f"{principal} ({where})" if principal else where


def outcome_of(status: int) -> str:
    return "ok" if status < 400 else "refused" if status < 500 else "failed"


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def object_of(route: Audited, path: str, request_body: bytes, response_body: bytes) -> str:
    """``kind/name``: from the path, else the body's ``metadata.name`` (apply), ``name`` (user, router) or
    ``username`` (login), or the answer's ``id`` (key and token create); nothing else of a body is read."""
    m = route.path.match(path)
    name = m.group("name") if m and "name" in m.groupdict() else ""
    if not name and route.kind in ("model", "adapter"):
        doc = _json(request_body)
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = meta.get("name") if isinstance(meta, dict) and isinstance(meta.get("name"), str) else ""
    if not name and route.kind in ("user", "router"):
        doc = _json(request_body)
        for field in ("name", "username"):
            value = doc.get(field) if isinstance(doc, dict) else None
            if isinstance(value, str) and value:
                name = value
                break
    if not name and route.kind == "engine":
        doc = _json(request_body)
        fields = ("engine", "version", "node", "pool")
        if isinstance(doc, dict) and all(isinstance(doc.get(k, ""), str) for k in fields):
            where = doc.get("node") or (f"pool {doc['pool']}" if doc.get("pool") else "")
            name = f"{doc.get('engine', '')} {doc.get('version', '')}" + (f" on {where}" if where else "")
            name = name.strip()
    if not name and route.kind == "settings":  # the keys changed, or (refused) the keys it tried to change
        doc = _json(response_body)
        changed = doc.get("changed") if isinstance(doc, dict) else None
        if isinstance(changed, list) and all(isinstance(k, str) for k in changed):
            name = ",".join(changed) or "(unchanged)"
        else:
            tried = _json(request_body)
            name = ",".join(sorted(k for k in tried if isinstance(k, str))[:10]) if isinstance(tried, dict) else ""
    if not name and route.kind in ("key", "token"):
        doc = _json(response_body)
        name = doc.get("id") if isinstance(doc, dict) and isinstance(doc.get("id"), str) else ""
    return f"{route.kind}/{name[:253] or '?'}"


def refusal_of(status: int, response_body: bytes) -> str:
    """A 4xx/5xx answer's error message (our one error shape); empty for a 2xx."""
    if status < 400:
        return ""
    doc = _json(response_body)
    err = doc.get("error") if isinstance(doc, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    return (message if isinstance(message, str) else f"answered {status}")[:_DETAIL_MAX]


def code_of(response_body: bytes) -> str:
    """An error answer's ``code`` ("too_many_logins"); "refused" when it has none."""
    doc = _json(response_body)
    err = doc.get("error") if isinstance(doc, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code[:40] if isinstance(code, str) and code else "refused"


class AuditEntryDoc(schemas.Body):
    id: int
    at: schemas.Number
    actor: str
    action: str
    object: str
    outcome: str
    detail: str


class AuditList(schemas.Body):
    items: list[AuditEntryDoc]


def entry_doc(e: AuditEntry) -> dict[str, Any]:
    return {"id": e.id, "at": e.at, "actor": e.actor, "action": e.action, "object": e.object,
            "outcome": e.outcome, "detail": e.detail}


class AuditMiddleware:
    """Records every request to an ``AUDITED`` route once, before its answer's last byte leaves.

    Recorded before the answer is sent, not after: a client that reads ``/api/v1/audit`` as soon as
    its change returned must find it there (the store thread runs calls in the order queued).
    """

    def __init__(self, app: ASGIApp, *, db: StoreThread, counts: auditcount.RefusalCounts | None = None) -> None:
        self.app, self.db = app, db
        self.counts = counts or auditcount.RefusalCounts(db)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = audited(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        client = scope.get("client")
        request_body, response_body = bytearray(), bytearray()
        status = 0
        recorded = False

        def record(outcome: str, detail: str) -> None:
            nonlocal recorded
            recorded = True
            path = scope.get("path", "")
            # Read when the answer is sent, not on arrival: the auth middleware (outside this one) put it
            # there before, and a login that succeeded names the user it proved.
            proved = scope.get(PRINCIPAL)
            if proved is None and status == 401 and route.action != "login":
                # No credential, so no actor: the auth middleware logs it. Recorded, a flood of anonymous
                # requests would fill a table that is never pruned. (A failed login is recorded.)
                return
            obj = object_of(route, path, bytes(request_body), bytes(response_body))
            if status == 429 and proved is None:
                # Rate limited: counted in one row per address and minute, not a row each (1,000 in 2.9 s).
                self.counts.refused(address=client[0] if client else "unknown", action=route.action,
                                    reason=code_of(bytes(response_body)), message=detail,
                                    name=obj.partition("/")[2] if not obj.endswith("/?") else "")
                return
            who = actor(headers.get(ACTOR_HEADER, ""), client[0] if client else "",
                        principal=proved.actor if proved is not None else "")
            if obj.endswith("/?") and proved is not None and route.action == "logout":  # the user who logged out
                obj = f"{route.kind}/{proved.name}"
            self.db.submit(self.db.store.record_audit, actor=who, action=route.action, object=obj,
                           outcome=outcome, detail=detail, at=time.time())

        async def receive_kept() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) < _KEEP_BODY:
                request_body.extend(message.get("body", b"")[: _KEEP_BODY - len(request_body)])
            return message

        async def send_recorded(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not recorded:
                if len(response_body) < _KEEP_BODY:
                    response_body.extend(message.get("body", b"")[: _KEEP_BODY - len(response_body)])
                if not message.get("more_body", False):
                    record(outcome_of(status), refusal_of(status, bytes(response_body)))
            await send(message)

        try:
            await self.app(scope, receive_kept, send_recorded)
        except BaseException as e:
            if not recorded:
                record("failed", f"{type(e).__name__} in the server; its log has the traceback")
            raise


def router(db: StoreThread) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/audit", response_model=AuditList)
    async def list_audit(since: int = paging.after_id("Entries after this id"),
                         limit: int = paging.limit(default=500)) -> dict[str, Any]:
        """The audit log, oldest first: who changed what, when, and whether it was done, refused or failed."""
        return {"items": [entry_doc(e) for e in await db.list_audit(since_id=since, limit=limit)]}

    return r
