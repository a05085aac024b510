"""Principals (who a request is) and the permission table (what a method and path need).

Roles are ordered ``viewer < operator < admin``: each reaches what the ones below reach.
``router`` is apart: a router's credential reaches only what a router needs (the endpoints
document, its ejection and load reports, /metrics) and nothing any user role reaches, so a router
host that is taken over cannot change the cluster; and the endpoints document, which carries
every engine's bearer key, is served to routers only, never to a user, whatever their role.
"""

from __future__ import annotations

import dataclasses

VIEWER, OPERATOR, ADMIN, ROUTER = "viewer", "operator", "admin", "router"
#: The roles a user may have, weakest first.
USER_ROLES: tuple[str, ...] = (VIEWER, OPERATOR, ADMIN)
#: What a role needs for: read, change models/nodes/keys, manage users.
_RANK = {VIEWER: 0, OPERATOR: 1, ADMIN: 2}


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: a user (by a token or a session), a router, or everyone (``--insecure``)."""

    kind: str  # "user", "router" or "insecure"
    name: str
    role: str  # a USER_ROLES member, or ROUTER
    #: The stored token that authenticated it ("" for the in-memory router token and insecure mode).
    token_id: str = ""

    @property
    def actor(self) -> str:
        """How the audit log names it: ``user:admin``, ``router:r1``, ``insecure``."""
        return "insecure" if self.kind == "insecure" else f"{self.kind}:{self.name}"

    def describe(self) -> str:
        """``user bob has role viewer`` (for a refusal)."""
        if self.kind == "router":
            return f"router {self.name} (a router credential)"
        return f"{self.kind} {self.name} has role {self.role}"


#: ``llmgw server --insecure``: every request is this, and every check passes.
INSECURE = Principal("insecure", "insecure", ADMIN)


@dataclasses.dataclass(frozen=True, slots=True)
class Need:
    """What a request needs: a user role at least ``role`` ("" for none), and/or a router credential."""

    role: str = ""  # "" : no user role reaches it
    router: bool = False

    def allows(self, p: Principal) -> bool:
        if p.kind == "insecure":
            return True
        if p.role == ROUTER:
            return self.router
        return bool(self.role) and p.role in _RANK and _RANK[p.role] >= _RANK[self.role]

    def describe(self) -> str:
        if self.role and self.router:
            return f"{self.role} or a router credential"
        return self.role or "a router credential"


PUBLIC = Need()  # marker: no credential needed (compared by identity)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def required(method: str, path: str) -> Need | None:
    """What ``method path`` needs; None when it needs no credential at all (health, login, the API docs)."""
    if (method in ("GET", "HEAD") and path == "/healthz") or (method == "POST" and path == "/api/v1/login"):
        return None
    if _under(path, "/api/v1/sso"):  # single sign-on makes a credential: it cannot need one (issue 28)
        return None
    if method in ("GET", "HEAD") and path in ("/api/docs", "/api/openapi.json"):
        return None  # the API's shape, no secret: a browser opens the docs page `make up` prints (issue 24)
    if method in ("GET", "HEAD") and path in ("/api/v1/ca", "/api/v1/ca.crt"):
        return None  # the cluster CA's certificate: public, and read before a client trusts the server
    if path == "/metrics":
        return Need(VIEWER, router=True)
    if _under(path, "/api/v1/users") or _under(path, "/api/v1/routers"):
        return Need(ADMIN)
    if path == "/api/v1/settings" and method not in ("GET", "HEAD"):  # the cluster's spec policy (issue 24)
        return Need(ADMIN)
    if method == "POST" and path.startswith("/api/v1/nodes/") and path.endswith("/upgrade"):
        return Need(ADMIN)  # runs another llmgw release as the agent (as root, often), from the cluster's index
    if _under(path, "/api/v1/tokens"):  # join tokens make nodes: an admin's, as `llmgw token create` was on the host
        return Need(ADMIN)
    if _under(path, "/api/v1/projects") or _under(path, "/api/v1/keys"):
        # Issue 26: a project's owner and members manage keys there too; the handlers make the fine checks
        # (``projectaccess``), as only the store knows who belongs to which project.
        return Need(VIEWER)
    if method in ("GET", "HEAD"):
        if path in ("/api/v1/endpoints", "/api/v1/router/kv"):  # engines' addresses and keys; what they hold
            return Need(router=True)
        if path.startswith("/api/v1/router/tokenizer/"):  # a kv_aware model's public tokenizer files (issue 31)
            return Need(VIEWER, router=True)
        if _under(path, "/api/v1/audit"):
            return Need(OPERATOR)
        if path == "/api/v1/controlplanes":  # who leads and where (`llmgw get controlplanes`): every user role
            return Need(VIEWER)
        return Need(VIEWER)
    if method == "POST" and path in ("/api/v1/router/events", "/api/v1/router/signals", "/api/v1/router/usage",
                                     "/api/v1/router/quota", "/api/v1/router/batch/claim",
                                     "/api/v1/router/batch/results"):
        return Need(router=True)
    if method == "POST" and path == "/api/v1/logout":  # anyone logged in may end their own token
        return Need(VIEWER)
    return Need(OPERATOR)
