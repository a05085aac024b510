"""``llmgw server``'s tunnel port (issue 33): where agents of nodes behind NAT dial, and the in-process router's way
to their engines.

It joins the three parts that never import each other: the router's ``TunnelHub`` (the port, the streams), the
control plane's ``EngineAccess`` (each node's engine_access and tunnel, read by the routers' table) and the agent
service (which offers the port after a Register). A node certificate is checked as the agent port checks it (known
to the store, not revoked: ``Issuer.check_presented``). For engine_access auto, ``check_reachable`` connects to each
auto node's ready engines from here every few seconds: a node whose engines this router cannot reach is served
through its tunnel. ``open_door`` lets standalone routers in on the same port with their router token
(``router.tunnel.relay.Door``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse

from llmgw.control.agentsvc import join as join_mod
from llmgw.control.auth.credentials import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.engineaccess import EngineAccess
from llmgw.control.state import Phase
from llmgw.router.tunnel.hub import TunnelHub, server_context
from llmgw.router.tunnel.relay import Check, Door
from llmgw.serving.config import ServerConfig

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
CONNECT_TIMEOUT_S = 2.0


async def start(cfg: ServerConfig, cluster: Cluster, tls: join_mod.AgentTls | None) -> tuple[TunnelHub | None,
                                                                                              EngineAccess]:
    """The tunnel port listening (None with --insecure: agents have no certificate) and the nodes' engine access."""
    access = cluster.engine_access
    if tls is None or cluster.db is None:
        return None, access
    issuer = join_mod.Issuer(tls, cluster.db)
    pki = cfg.data_dir / "pki"
    hub = TunnelHub(context=server_context(ca_pem=tls.ca.cert_pem, cert_file=str(pki / "server.crt"),
                                           key_file=str(pki / "server.key")),
                    check=issuer.check_presented, on_change=access.tunnel)
    try:
        await hub.start(cfg.host, cfg.tunnel_port)
    except OSError as exc:
        raise OSError(f"cannot listen for tunnels on {cfg.host}:{cfg.tunnel_port}: {exc.strerror or exc}; pass "
                      "--tunnel-port") from None
    cluster.tunnel_port = hub.port
    return hub, access


def router_check(auth: Auth) -> Check:
    """A standalone router's credential at the tunnel port: a router token the REST API takes now."""
    async def check(token: str) -> str:
        found = await auth.principal(token)
        if found is None or found.kind != "router":
            return ("this tunnel port takes only a router token the control plane knows (this one is unknown, "
                    "expired or deleted); make one with `llmgw router-token create NAME` and give it to the "
                    "router's --token-file")
        return ""
    return check


def open_door(hub: TunnelHub | None, auth: Auth) -> Door | None:
    """Standalone routers reach tunnelled engines through ``hub`` with their router token (None: no hub)."""
    if hub is None:
        return None
    door = Door(hub, router_check(auth))
    hub.routers = door.protocol
    return door


async def _reaches(url: str) -> str:
    """"" when a TCP connection to the engine at ``url`` is made, else why not."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not parts.port:
        return f"{url!r} names no address"
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except TimeoutError:
        return f"no connection to {parts.netloc} within {CONNECT_TIMEOUT_S:g}s"
    except OSError as exc:
        return f"cannot connect to {parts.netloc}: {exc.strerror or exc}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ""


async def check_reachable(cluster: Cluster, access: EngineAccess) -> None:
    """engine_access auto: every few seconds, whether this router reaches each auto node's ready engines."""
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        nodes = set(access.auto_nodes())
        if not nodes:
            continue
        try:
            replicas = await cluster.ctx.call(cluster.ctx.store.list_replicas)
        except Exception as exc:  # a database that does not answer: the next round
            log.debug("engine access check: %s", exc)
            continue
        for node in nodes:
            urls = [r.endpoint for r in replicas if r.node_id == node and r.endpoint and r.phase is Phase.READY]
            if urls:
                access.reachable(node, await _reaches(urls[0]))
