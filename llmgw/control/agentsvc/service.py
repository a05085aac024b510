"""The agent stream's server end: one ``Connect`` call per connected agent.

Protobuf stops here: messages are converted to core types on arrival and
handed to the cluster; commands from the cluster are converted on the way out.
Each stream has an outgoing queue, so a command never waits on the network
while the reconcile loop runs. Heartbeats are counted and timed here
(``metrics``); ``bench/fleet.py`` reads those with 10,000 simulated agents.

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
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

import grpc
from google.protobuf import message as pb_message

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.control.agentsvc import collector, metrics
from llmgw.control.agentsvc import join as join_mod
from llmgw.control.cluster import Cluster
from llmgw.control.store.store import StoredNode
from llmgw.core import fabrictest as ft
from llmgw.core import pki
from llmgw.core.provision import Provision
from llmgw.core.shards import ShardSpec

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


class LogBatch(NamedTuple):
    lines: tuple[str, ...]
    error: str
    done: bool


class _Link:
    """The cluster's handle on one stream."""

    def __init__(self, node_id: str, *, peer: str = "", term: int = 0) -> None:
        self.node_id = node_id
        self.peer = peer
        #: The leader's term this stream was accepted at: every command carries it (agents refuse older ones).
        self.term = term
        self.error = ""  # why the server ends the stream, for the peer; empty for a plain end
        self.queue: asyncio.Queue[pb.ControlMessage | None] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._logs: dict[str, asyncio.Queue[LogBatch]] = {}
        #: A RenewCert being signed: a second one while it is is not signed twice.
        self.renewing = False
        #: Fabric test sides sent and not yet answered, by test id (a node runs one side of a test).
        self._fabric: dict[str, asyncio.Future[ft.FabricTestResult]] = {}

    def _put(self, **body: object) -> None:
        self.queue.put_nowait(pb.ControlMessage(seq=next(self._seq), term=self.term, **body))

    def start_shard(self, spec: ShardSpec) -> None:
        self._put(start_shard=pb.StartShard(spec=convert.spec_to_pb(spec)))

    def stop_shard(self, shard_id: str, *, reason: str) -> None:
        self._put(stop_shard=pb.StopShard(shard_id=shard_id, reason=reason))

    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None:
        self._put(drain=pb.Drain(shard_id=shard_id, timeout_s=timeout_s))

    def remove_weights(self, cache_name: str) -> None:
        self._put(remove_weights=pb.RemoveWeights(cache_name=cache_name))

    def provision(self, provision: Provision) -> None:
        self._put(provision=convert.provision_to_pb(provision))

    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> tuple[str, asyncio.Queue[LogBatch]]:
        request_id = uuid.uuid4().hex
        replies: asyncio.Queue[LogBatch] = asyncio.Queue(maxsize=1000)
        self._logs[request_id] = replies
        self._put(logs_request=pb.LogsRequest(request_id=request_id, shard_id=shard_id, lines=lines, follow=follow))
        return request_id, replies

    def cancel_logs(self, request_id: str) -> None:
        if self._logs.pop(request_id, None) is not None:
            self._put(logs_cancel=pb.LogsCancel(request_id=request_id))

    def logs_reply(self, reply: pb.LogsReply) -> None:
        replies = self._logs.get(reply.request_id)
        if replies is None:
            return
        batch = LogBatch(tuple(reply.lines), reply.error, reply.done or bool(reply.error))
        if batch.done:
            del self._logs[reply.request_id]
        try:
            replies.put_nowait(batch)
        except asyncio.QueueFull:
            # A reader that stopped reading must not hold the stream's memory.
            self.cancel_logs(reply.request_id)

    def end_logs(self) -> None:
        for replies in self._logs.values():
            with contextlib.suppress(asyncio.QueueFull):
                replies.put_nowait(LogBatch((), f"node {self.node_id} disconnected", True))
        self._logs.clear()

    def fabric_test(self, req: ft.FabricTestRequest) -> asyncio.Future[ft.FabricTestResult]:
        """Sends one side of a fabric test; the future gets the agent's FabricTestResult."""
        fut: asyncio.Future[ft.FabricTestResult] = asyncio.get_running_loop().create_future()
        self._fabric[req.test_id] = fut
        self._put(fabric_test=convert.fabric_test_to_pb(req))
        return fut

    def forget_fabric_test(self, test_id: str) -> None:
        """Stops waiting for a test's answer (the caller gave up); a late one is then dropped."""
        self._fabric.pop(test_id, None)

    def fabric_result(self, msg: pb.FabricTestResult) -> None:
        fut = self._fabric.pop(msg.test_id, None)
        if fut is not None and not fut.done():
            fut.set_result(convert.fabric_result_from_pb(msg))

    def end_fabric_tests(self) -> None:
        """Answers every test side still waiting: the stream that would have carried its result is gone."""
        for test_id, fut in self._fabric.items():
            if not fut.done():
                fut.set_result(ft.FabricTestResult(test_id, "", False, error=f"node {self.node_id} disconnected "
                                                   "during the test; its agent was reconnecting or stopped"))
        self._fabric.clear()

    def controlplanes(self, addrs: tuple[str, ...]) -> None:
        self._put(controlplanes=pb.ControlPlanes(addrs=addrs))

    def cert_issued(self, *, cert_pem: bytes = b"", error: str = "") -> None:
        self._put(cert_issued=pb.CertIssued(cert_pem=cert_pem, error=error))

    def ack(self, seq: int, *, ok: bool, error: str = "", controlplanes: tuple[str, ...] = ()) -> None:
        self._put(ack=pb.Ack(seq=seq, ok=ok, error=error, term=self.term, controlplanes=controlplanes))

    def close(self, reason: str) -> None:
        log.info("closing stream of node %s: %s", self.node_id, reason)
        self.queue.put_nowait(None)


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, cluster: Cluster, *, issuer: join_mod.Issuer | None = None, agent_port: int = 0) -> None:
        self.cluster = cluster
        #: Signs and checks node certificates; None: ``--insecure``, no identity checked.
        self.issuer = issuer
        #: Named in the join port's refusal of a stream (set once the port is bound).
        self.agent_port = agent_port
        #: The stream each node id holds now. A Register for one of these is refused: before,
        #: it replaced the stream, so any process that named a connected node took its place
        #: and received its StartShards (issue 13).
        self._live: dict[str, _Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()

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
        refusal = _check_register(first)
        rejoin = False  # the certificate is refused for good: the agent stops redialling (agent/rejoin.py)
        if not refusal:
            refusal, rejoin = await self._check_identity(first.register.node_id, context)
        refusal = refusal or self._check_not_connected(first.register.node_id, peer)
        if not refusal and not self.cluster.leading:  # deposed while the identity was checked
            refusal = "this control plane stopped leading while the agent registered; dial again"
        if refusal:
            log.warning("refused agent at %s: %s", peer, refusal)
            yield pb.ControlMessage(seq=0, ack=pb.Ack(seq=first.seq, ok=False, error=refusal, rejoin=rejoin))
            return
        reg = first.register
        link = _Link(reg.node_id, peer=peer, term=self.cluster.term)
        now = self.cluster.clock()
        node = StoredNode(
            id=reg.node_id, hostname=reg.hostname or reg.node_id, mgmt_addr=reg.mgmt_addr,
            agent_version=reg.agent_version, inventory=convert.inventory_from_register(reg),
            labels=dict(reg.labels), first_seen=now, last_seen=now)
        link.ack(first.seq, ok=True, controlplanes=self.cluster.hint()[1])
        metrics.REGISTRATIONS.inc()
        collector.note_registration()
        self.cluster.node_registered(node, [convert.status_from_pb(s) for s in reg.shards], link)
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

    async def _read(self, request_iterator: AsyncIterator[pb.AgentMessage], link: _Link) -> None:
        try:
            async for msg in request_iterator:
                self._handle(msg, link)
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
        return pb.Ack(seq=first.seq, ok=False, error=error, leader=leader, controlplanes=peers)

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

    async def _renew(self, csr_pem: bytes, link: _Link) -> None:
        assert self.issuer is not None
        try:
            cert_pem = await self.issuer.renew(link.node_id, csr_pem)
        except pki.PkiError as e:
            log.warning("refused to renew the certificate of node %s: %s", link.node_id, e)
            link.cert_issued(error=str(e))
        except Exception as e:
            log.exception("renewing the certificate of node %s failed", link.node_id)
            link.cert_issued(error=f"renewing failed on the control plane ({type(e).__name__}); see its log")
        else:
            log.info("renewed the certificate of node %s: serial %s", link.node_id, join_mod.serial_of(cert_pem))
            link.cert_issued(cert_pem=cert_pem)
        finally:
            link.renewing = False

    def _check_not_connected(self, node_id: str, peer: str) -> str:
        held = self._live.get(node_id)
        if held is None:
            return ""
        return (f"node {node_id!r} is already connected from {held.peer}; this second stream from {peer} is "
                "refused until that one ends (a restarted agent gets in once its old stream closes, within "
                "15 s by keepalive if its host vanished); if this is another machine, give it its own --node-id")

    def _handle(self, msg: pb.AgentMessage, link: _Link) -> None:
        kind = msg.WhichOneof("body")
        _count(kind)
        if kind == "heartbeat":
            t0 = time.perf_counter()
            hb = convert.heartbeat_from_pb(msg.heartbeat)
            view = self.cluster.nodes.get(link.node_id)
            if view is not None and hb.gpus and hb.gpus == view.inventory.gpus:
                # The same GPUs as last time: keep the objects already held, so the new ones die
                # at once instead of living a heartbeat period and reaching the oldest GC
                # generation (see collector): 8 Gpu objects a beat, per node, otherwise.
                hb = dataclasses.replace(hb, gpus=view.inventory.gpus)
            self.cluster.node_heartbeat(link.node_id, hb)
            _observe_heartbeat(time.perf_counter() - t0)
        elif kind == "shard_status":
            self.cluster.shard_reported(link.node_id, convert.status_from_pb(msg.shard_status))
        elif kind == "goodbye":
            self.cluster.node_leaving(link.node_id, msg.goodbye.reason or "its agent is stopping")
        elif kind == "fabric_result":
            link.fabric_result(msg.fabric_result)
        elif kind == "logs_reply":
            link.logs_reply(msg.logs_reply)
        elif kind == "ack":
            if not msg.ack.ok:
                log.warning("node %s refused command %d: %s", link.node_id, msg.ack.seq, msg.ack.error)
        elif kind == "register":
            log.warning("node %s sent a second Register on one stream; ignored", link.node_id)
        elif kind == "renew_cert":
            if self.issuer is None:
                link.cert_issued(error="this control plane runs with --insecure and issues no certificates")
            elif not link.renewing:
                link.renewing = True
                task = asyncio.create_task(self._renew(msg.renew_cert.csr_pem, link))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        # Unknown kinds come from a newer agent; ignoring them keeps it working.


_observe_heartbeat = metrics.HEARTBEAT_SECONDS.observe
_counters = {f.name: metrics.MESSAGES.labels(kind=f.name)
             for f in pb.AgentMessage.DESCRIPTOR.oneofs_by_name["body"].fields}


def _count(kind: str | None) -> None:
    counter = _counters.get(kind or "")
    if counter is not None:  # a kind from a newer agent is not a label: it could mint series
        counter.inc()


def _check_register(msg: pb.AgentMessage) -> str:
    if msg.WhichOneof("body") != "register":
        return "the first message on the stream must be Register"
    if not msg.register.node_id:
        return "Register.node_id is empty; set node_id in the agent's config or fix the hostname"
    return ""


async def serve(cluster: Cluster, *, host: str, port: int, tls: join_mod.AgentTls | None = None,
                join_port: int = 0) -> tuple[grpc.aio.Server, int, int]:
    """Starts the gRPC server; returns it, the agent port and the join port (0 without TLS).

    ``port``/``join_port`` 0 pick free ones. Without ``tls`` (``--insecure``) there is one plaintext port.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    issuer = join_mod.Issuer(tls, cluster.db) if tls is not None and cluster.db is not None else None
    if tls is not None and issuer is None:
        raise OSError("the agent service with TLS needs the cluster's store thread (Cluster(db=...))")
    service = AgentService(cluster, issuer=issuer)
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
