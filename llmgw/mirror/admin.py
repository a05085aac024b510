"""Who may read the mirror's ``/admin/stats``: an administrator, never anyone who can reach the port.

The stats name the upstream and every file pulled through it, with counts: what a bench needs, and what an
outsider mapping the cluster wants. The mirror's admin token always answers. Mounted in a control plane
(``llmgw server --mirror-dir``), the control plane says whether a bearer token is one of its admins'
(``stats_auth``, from ``llmgw.serve``). A standalone ``llmgw mirror`` without an admin token answers only
on its own host (a loopback peer), as a bench or an operator on that host reads it.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from starlette.requests import Request

#: Whether a bearer token ("" when none was sent) may read ``/admin/stats``: the mounting control plane's check.
StatsAuth = Callable[[str], Awaitable[bool]]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def stats_refusal(request: Request, *, admin_token: str, stats_auth: StatsAuth | None) -> str:
    """"" when ``request`` may read the stats; otherwise the sentence of its 401, saying what to send."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    token = given.strip() if scheme.lower() == "bearer" else ""
    if token and admin_token and hmac.compare_digest(token.encode(), admin_token.encode()):
        return ""
    if stats_auth is not None:
        if await stats_auth(token):
            return ""
        return ("the mirror's stats need an administrator: send 'Authorization: Bearer TOKEN' with an admin's "
                "token of this control plane (`llmgw login` as an admin), or the mirror's admin token "
                "(LLMGW_MIRROR_ADMIN_TOKEN)")
    if not admin_token and _loopback(request.client.host if request.client else ""):
        return ""
    return ("the mirror's stats need its admin token: send 'Authorization: Bearer TOKEN' (start the mirror with "
            "--admin-token-file FILE or LLMGW_MIRROR_ADMIN_TOKEN; without one they answer only on the mirror's "
            "own host)")
