"""The agent stream's server end: one ``Connect`` call per connected agent.

This module accepts or refuses a stream (its Register, the peer's identity, a standby's answer naming the
leader) and serves ``Join``. Once a stream is accepted, what arrives is carried out by ``inbound`` (a table of
kind -> handler) and what the cluster sends goes through the stream's ``link.Link``.

Identity (issue 13): with TLS (the default) one server listens on two ports. The agent port asks
every peer for a certificate signed by the cluster CA (``require_client_auth``: without it gRPC does
not even request one) and takes its common name as the node id: a Register naming another node, or
a certificate revoked or unknown to the store, is refused. The join port authenticates only the
server and serves ``Join``, which turns a bootstrap token and a CSR into the node's certificate
(``join``). Both ports send the server's certificate with the CA's after it, from which a joining
agent takes the CA and checks it against the hash in its join command before it sends anything.
``--insecure`` (``tls`` None): one plaintext port, any node id, no Join, as before issue 13.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import message as pb_message

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.control.agentsvc import collector, inbound, metrics
from llmgw.control.agentsvc import join as join_mod
from llmgw.control.agentsvc.link import Link
from llmgw.control.cluster import Cluster
from llmgw.control.engineaccess import EngineAccess
from llmgw.control.store.store import StoredNode
from llmgw.core import pki, skew
from llmgw.core.version import version

log = logging.getLogger(__name__)
REGISTER_TIMEOUT_S = 10.0

#: Keepalive pings find a peer that vanished without closing (a powered-off
#: node), which otherwise holds a stream open until TCP gives up, for minutes.
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # Without it grpc >= 1.5x waits 60 s for a ping's answer whatever keepalive_timeout says (measured:
    # a frozen peer was found dead after 70 s, not 15).
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, cluster: Cluster, *, issuer: join_mod.Issuer | None = None, agent_port: int = 0,
                 protocol: int = skew.PROTOCOL, server_version: str | None = None) -> None:
        """``protocol``/``server_version``: what this control plane says it is in every Register's answer, and
        what the skew policy (``core.skew``) is checked against: this release's (tests act as another)."""
        self.cluster = cluster
        self.protocol = protocol
        self.server_version = version() if server_version is None else server_version
        #: Signs and checks node certificates; None: ``--insecure``, no identity checked.
        self.issuer = issuer
        #: Named in the join port's refusal of a stream (set once the port is bound).
        self.agent_port = agent_port
        #: Issue 33: each node's engine_access (``control.engineaccess``), and the tunnel port offered (0: none).
        self.engine_access: EngineAccess | None = None
        self.tunnel_port = 0
        #: The stream each node id holds now. A Register for one of these is refused: before,
        #: it replaced the stream, so any process that named a connected node took its place
        #: and received its StartShards (issue 13).
        self._live: dict[str, Link] = {}
        #: What is done with each message an agent sends once its stream is accepted.
        self.inbound = inbound.Inbound(cluster, issuer)

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],  # noqa: N802 (gRPC's name)
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ControlMessage]:
        peer = context.peer()
        try:
            first = await asyncio.wait_for(anext(request_iterator), REGISTER_TIMEOUT_S)
        except TimeoutError:
            log.warning("agent at %s sent no Register within %.0fs", peer, REGISTER_TIMEOUT_S)
            return
        except StopAsyncIteration:
            # gRPC ends the stream so, too, for a message over its receive limit (4 MiB).
            log.warning("agent at %s ended its stream before a Register (or sent a message over 4 MiB)", peer)
            return
        except pb_message.DecodeError:
            # Without this, gRPC logged a traceback and the peer learnt nothing.
            reason = "the first message is not an AgentMessage (bytes protobuf cannot decode); is it an llmgw agent?"
            log.warning("refused agent at %s: %s", peer, reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        standby = self._standby_refusal(first)
        if standby is not None:
            # Before the identity is checked: a standby tells any agent where the leader is (the address
            # is no secret: every agent of the cluster is given every control plane's).
            # DEBUG: in a failover every agent of the fleet asks again each second until the lease moves.
            log.debug("sent agent at %s to the leader: %s", peer, standby.error)
            metrics.STANDBY_REFUSALS.inc()
            yield pb.ControlMessage(seq=0, ack=standby)
            return
        refusal, rejoin = await self._refusal(first, context, peer)
        if refusal:
            log.warning("refused agent at %s: %s", peer, refusal)
            yield pb.ControlMessage(seq=0, ack=pb.Ack(seq=first.seq, ok=False, error=refusal, rejoin=rejoin,
                                                      protocol=self.protocol, server_version=self.server_version))
            return
        reg = first.register
        link = self._accept(first, peer)
        # Held from here to the finally below and nowhere else: an entry left behind would lock
        # the node out for good.
        self._live[reg.node_id] = link
        reader = asyncio.create_task(self._read(request_iterator, link))
        try:
            while True:
                msg = await link.queue.get()
                if msg is None:
                    break
                yield msg
            if link.error:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, link.error)
        finally:
            if self._live.get(reg.node_id) is link:
                del self._live[reg.node_id]
            reader.cancel()
            link.end_logs()
            link.end_fabric_tests()
            self.cluster.node_disconnected(reg.node_id, link)

    async def _refusal(self, first: pb.AgentMessage, context: grpc.aio.ServicerContext, peer: str) -> tuple[str, bool]:
        """Why this Register is refused ("" when it is not), and whether the certificate is refused for good (the
        agent then stops redialling: agent/rejoin.py)."""
        refusal = _check_register(first)
        rejoin = False
        if not refusal:
            refusal, rejoin = await self._check_identity(first.register.node_id, context)
        refusal = refusal or self._check_skew(first.register)
        refusal = refusal or self._check_not_connected(first.register.node_id, peer)
        if not refusal and not self.cluster.leading:  # deposed while the identity was checked
            refusal = "this control plane stopped leading while the agent registered; dial again"
        return refusal, rejoin

    def _check_skew(self, reg: pb.Register) -> str:
        """Why an agent of this protocol may not register here ("" when the skew policy allows it): the
        sentence names both versions and what to upgrade."""
        said = "".join(c for c in reg.agent_version[:64] if c.isprintable())  # the peer's words, into our log
        return skew.peer_refusal("agent", reg.protocol, said, server_protocol=self.protocol,
                                 server_version=self.server_version)

    def _accept(self, first: pb.AgentMessage, peer: str) -> Link:
        """Answers an accepted Register and hands the node, its shards and its new link to the cluster."""
        reg = first.register
        link = Link(reg.node_id, peer=peer, term=self.cluster.term)
        now = self.cluster.clock()
        node = StoredNode(
            id=reg.node_id, hostname=reg.hostname or reg.node_id, mgmt_addr=reg.mgmt_addr,
            agent_version=reg.agent_version, inventory=convert.inventory_from_register(reg),
            labels=dict(reg.labels), first_seen=now, last_seen=now)
        link.ack(first.seq, ok=True, controlplanes=self.cluster.hint()[1], protocol=self.protocol,
                 server_version=self.server_version)
        if self.engine_access is not None:  # issue 33: how routers reach its engines, and its tunnel port
            self.engine_access.registered(reg.node_id, reg.engine_access)
            if reg.engine_access in ("tunnel", "auto") and self.tunnel_port:
                link.tunnel_offer(self.tunnel_port)
        metrics.REGISTRATIONS.inc()
        collector.note_registration()
        self.cluster.node_registered(node, [convert.status_from_pb(s) for s in reg.shards], link)
        return link

    async def _read(self, request_iterator: AsyncIterator[pb.AgentMessage], link: Link) -> None:
        try:
            async for msg in request_iterator:
                self.inbound.dispatch(msg, link)
        except grpc.aio.AioRpcError as e:
            log.info("stream of node %s ended: %s", link.node_id, e.code().name)
        except pb_message.DecodeError:
            link.error = "a message is not an AgentMessage (bytes protobuf cannot decode); the stream is closed"
            log.warning("closing stream of node %s from %s: %s", link.node_id, link.peer, link.error)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stream of node %s failed", link.node_id)
        finally:
            link.queue.put_nowait(None)

    def _standby_refusal(self, first: pb.AgentMessage) -> pb.Ack | None:
        """The answer of a standby to a Register: where the leader is, or that none is known yet."""
        if self.cluster.leading:
            return None
        leader, peers = self.cluster.hint()
        if leader:
            error = f"this control plane is a standby; the leader is at {leader}: dial it"
        else:
            error = ("this control plane is a standby and no leader holds the lease now (a failover is under way); "
                     "try again in a few seconds")
        return pb.Ack(seq=first.seq, ok=False, error=error, leader=leader, controlplanes=peers, protocol=self.protocol,
                      server_version=self.server_version)

    async def _check_identity(self, node_id: str, context: grpc.aio.ServicerContext) -> tuple[str, bool]:
        """Why the peer may not be ``node_id`` (no certificate, another node's, revoked; "" when it may), and
        whether only a new join can cure it (its certificate is revoked, or unknown to the store)."""
        if self.issuer is None:
            return "", False
        presented = context.auth_context().get("x509_pem_cert") or []
        if not presented:
            # Only the join port lets a peer in without a certificate (the agent port's handshake refuses it).
            return (f"this is the join port, which serves only Join; the agent stream is on port {self.agent_port}: "
                    f"run the agent with the server HOST:{self.agent_port} (`llmgw agent join` writes it to "
                    "pki/join.json)"), False
        cert_pem = presented[0]
        try:
            cn = pki.common_name(cert_pem)
        except pki.PkiError as e:  # gRPC checked the chain; a certificate it took yet we cannot read is odd
            return f"the client certificate cannot be read: {e}", False
        if cn != node_id:
            return (f"this certificate is node {cn!r}'s, and Register names node {node_id!r}: an agent registers "
                    f"as the node its certificate names; run it with --node-id {cn} (or without --node-id), or "
                    f"join {node_id!r} with a token of its own"), False
        refused = await self.issuer.check_presented(cert_pem, node_id)
        return refused, bool(refused)

    async def Join(self, request: pb.JoinRequest,  # noqa: N802 (gRPC's name)
                   context: grpc.aio.ServicerContext) -> pb.JoinReply:
        peer = context.peer()
        if self.issuer is None:
            reason = ("this control plane runs with --insecure: nodes do not join, they connect in plaintext with "
                      "`llmgw agent --insecure --server HOST:PORT`")
            log.warning("refused a join from %s: %s", peer, reason)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)
        if not self.cluster.leading:
            leader = self.cluster.hint()[0]
            reason = ("this control plane is a standby and issues no certificates: run the join command against "
                      f"the leader{f' (its agents dial {leader}; same host, its join port)' if leader else ''}; "
                      "`llmgw get controlplanes` lists them")
            log.warning("refused a join from %s: %s", peer, reason)
            await context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        try:
            node_id, cert_pem = await self.issuer.join(token=request.token, csr_pem=request.csr_pem,
                                                       asked_id=request.node_id, peer=peer)
        except join_mod.JoinRefused as e:
            log.warning("refused a join from %s (asking to be node %r): %s", peer, request.node_id[:80], e)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        log.info("node %s joined from %s", node_id, peer)
        held = self._live.get(node_id)
        if held is not None:  # a rejoin: the join revoked the certificate this stream was opened with
            held.close(f"node {node_id} joined again from {peer}; the certificate of this stream is revoked")
        return pb.JoinReply(cert_pem=cert_pem, ca_pem=self.issuer.tls.ca.cert_pem, node_id=node_id,
                            agent_port=self.agent_port)

    def _check_not_connected(self, node_id: str, peer: str) -> str:
        held = self._live.get(node_id)
        if held is None:
            return ""
        return (f"node {node_id!r} is already connected from {held.peer}; this second stream from {peer} is "
                "refused until that one ends (a restarted agent gets in once its old stream closes, within "
                "15 s by keepalive if its host vanished); if this is another machine, give it its own --node-id")


def _check_register(msg: pb.AgentMessage) -> str:
    if msg.WhichOneof("body") != "register":
        return "the first message on the stream must be Register"
    if not msg.register.node_id:
        return "Register.node_id is empty; set node_id in the agent's config or fix the hostname"
    return ""


async def serve(cluster: Cluster, *, host: str, port: int, tls: join_mod.AgentTls | None = None,
                join_port: int = 0, engine_access: EngineAccess | None = None,
                tunnel_port: int = 0) -> tuple[grpc.aio.Server, int, int]:
    """Starts the gRPC server; returns it, the agent port and the join port (0 without TLS).

    ``port``/``join_port`` 0 pick free ones. Without ``tls`` (``--insecure``) there is one plaintext port.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    issuer = join_mod.Issuer(tls, cluster.db) if tls is not None and cluster.db is not None else None
    if tls is not None and issuer is None:
        raise OSError("the agent service with TLS needs the cluster's store thread (Cluster(db=...))")
    service = AgentService(cluster, issuer=issuer)
    service.engine_access, service.tunnel_port = engine_access, tunnel_port
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    bound_join = 0
    if tls is None:
        bound = _bind(lambda: server.add_insecure_port(f"{host}:{port}"), host, port, "--agent-port")
    else:
        pair = [(tls.server_key_pem, tls.chain_pem)]
        # require_client_auth=True: gRPC asks for and verifies a client certificate against the CA; with False
        # it does not even ask, so a stream could never be tied to a node.
        mutual = grpc.ssl_server_credentials(pair, root_certificates=tls.ca.cert_pem, require_client_auth=True)
        bound = _bind(lambda: server.add_secure_port(f"{host}:{port}", mutual), host, port, "--agent-port")
        server_only = grpc.ssl_server_credentials(pair)
        bound_join = _bind(lambda: server.add_secure_port(f"{host}:{join_port}", server_only), host, join_port,
                           "--join-port")
    service.agent_port = bound
    await server.start()
    return server, bound, bound_join


def _bind(add: Callable[[], int], host: str, port: int, flag: str) -> int:
    try:
        bound = add()
    except RuntimeError:  # grpcio >= 1.6x raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for agents on {host}:{port}: the port is in use or the address "
                      f"is not this machine's; pass {flag}")
    return bound
