"""What the control plane does with each message an agent sends: a table of kind -> handler.

Protobuf stops here: a message is converted to core types and handed to the cluster (heartbeats, shard
statuses, a goodbye) or to the stream's ``Link`` (replies it waits for). ``HANDLERS`` names a handler for
every kind of ``AgentMessage.body``, ``NOT_HANDLED`` the kinds ignored on purpose, with why; a test checks
that together they are the oneof's kinds, so a kind added to ``agent.proto`` without a handler here fails it.
A kind this control plane does not know comes from a newer agent: ignoring it keeps that agent working.
Heartbeats are counted and timed here (``metrics``); ``bench/fleet.py`` reads those with 10,000 agents.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.control.agentsvc import join as join_mod
from llmgw.control.agentsvc import metrics
from llmgw.control.agentsvc.link import Link
from llmgw.control.cluster import Cluster
from llmgw.core import pki
from llmgw.core.agentupgrade import State, UpgradeStatus
from llmgw.core.inventory import Gpu

log = logging.getLogger(__name__)


class Inbound:
    """Carries out the messages agents send on their streams, each as ``HANDLERS`` says for its kind."""

    def __init__(self, cluster: Cluster, issuer: join_mod.Issuer | None) -> None:
        self.cluster = cluster
        #: Signs renewed node certificates; None: ``--insecure``, none is issued.
        self.issuer = issuer
        self._tasks: set[asyncio.Task[None]] = set()

    def dispatch(self, msg: pb.AgentMessage, link: Link) -> None:
        kind = msg.WhichOneof("body")
        _count(kind)
        handler = HANDLERS.get(kind or "")
        if handler is not None:
            handler(self, msg, link)

    def heartbeat(self, msg: pb.AgentMessage, link: Link) -> None:
        t0 = time.perf_counter()
        hb = convert.heartbeat_from_pb(msg.heartbeat)
        view = self.cluster.nodes.get(link.node_id)
        if view is not None and hb.gpus:
            # The same GPUs as last time: keep the objects already held, so the new ones die
            # at once instead of living a heartbeat period and reaching the oldest GC
            # generation (see collector): 8 Gpu objects a beat, per node, otherwise. A busy
            # GPU's utilisation moves every beat: only that GPU is new, its processes kept.
            hb = dataclasses.replace(hb, gpus=_reuse_gpus(hb.gpus, view.inventory.gpus))
        self.cluster.node_heartbeat(link.node_id, hb)
        _observe_heartbeat(time.perf_counter() - t0)

    def shard_status(self, msg: pb.AgentMessage, link: Link) -> None:
        self.cluster.shard_reported(link.node_id, convert.status_from_pb(msg.shard_status))

    def goodbye(self, msg: pb.AgentMessage, link: Link) -> None:
        self.cluster.node_leaving(link.node_id, msg.goodbye.reason or "its agent is stopping")

    def fabric_result(self, msg: pb.AgentMessage, link: Link) -> None:
        link.fabric_result(msg.fabric_result)

    def upgrade_status(self, msg: pb.AgentMessage, link: Link) -> None:
        m = msg.upgrade_status
        state = _UPGRADE_STATES.get(m.state)
        if state is None:
            log.warning("node %s reports upgrade %s in a state this control plane does not know (%d); ignored",
                        link.node_id, m.id[:40], m.state)
            return
        self.cluster.upgrades.reported(link.node_id, UpgradeStatus(m.id, m.version, state, m.message,
                                                                   tuple(m.last_output)))

    def kv_digest(self, msg: pb.AgentMessage, link: Link) -> None:
        self.cluster.kv.take(link.node_id, convert.digest_from_pb(msg.kv_digest))

    def logs_reply(self, msg: pb.AgentMessage, link: Link) -> None:
        link.logs_reply(msg.logs_reply)

    def ack(self, msg: pb.AgentMessage, link: Link) -> None:
        if not msg.ack.ok:
            log.warning("node %s refused command %d: %s", link.node_id, msg.ack.seq, msg.ack.error)

    def register(self, msg: pb.AgentMessage, link: Link) -> None:
        log.warning("node %s sent a second Register on one stream; ignored", link.node_id)

    def renew_cert(self, msg: pb.AgentMessage, link: Link) -> None:
        engine = msg.renew_cert.purpose == pb.CERT_PURPOSE_ENGINE
        purpose = pb.CERT_PURPOSE_ENGINE if engine else pb.CERT_PURPOSE_NODE
        if self.issuer is None:
            link.cert_issued(error="this control plane runs with --insecure and issues no certificates; set the "
                                   "agent's engine_tls to off, or run the control plane with TLS", purpose=purpose)
        elif engine:
            self._engine_cert(msg.renew_cert.csr_pem, link)
        elif not link.renewing:
            link.renewing = True
            task = asyncio.create_task(self._renew(msg.renew_cert.csr_pem, link))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _engine_cert(self, csr_pem: bytes, link: Link) -> None:
        """Signs an engine certificate for the stream's node (a signature, no store step: on the loop)."""
        assert self.issuer is not None
        try:
            cert_pem = self.issuer.engine(link.node_id, csr_pem)
        except pki.PkiError as e:
            log.warning("refused an engine certificate to node %s: %s", link.node_id, e)
            link.cert_issued(error=str(e), purpose=pb.CERT_PURPOSE_ENGINE)
            return
        log.info("issued an engine certificate to node %s: serial %s", link.node_id, join_mod.serial_of(cert_pem))
        link.cert_issued(cert_pem=cert_pem, purpose=pb.CERT_PURPOSE_ENGINE)

    async def _renew(self, csr_pem: bytes, link: Link) -> None:
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


Handler = Callable[[Inbound, pb.AgentMessage, Link], None]

#: Every kind of ``AgentMessage.body`` an agent sends on an accepted stream, and what is done with it.
HANDLERS: dict[str, Handler] = {
    "register": Inbound.register,
    "heartbeat": Inbound.heartbeat,
    "shard_status": Inbound.shard_status,
    "ack": Inbound.ack,
    "logs_reply": Inbound.logs_reply,
    "renew_cert": Inbound.renew_cert,
    "fabric_result": Inbound.fabric_result,
    "goodbye": Inbound.goodbye,
    "upgrade_status": Inbound.upgrade_status,
    "kv_digest": Inbound.kv_digest,
}
#: The kinds ignored on purpose, with why (none: every kind an agent sends is acted on).
NOT_HANDLED: dict[str, str] = {}

_UPGRADE_STATES = {pb.UPGRADE_INSTALLING: State.INSTALLING, pb.UPGRADE_RESTARTING: State.RESTARTING,
                   pb.UPGRADE_FAILED: State.FAILED}
_observe_heartbeat = metrics.HEARTBEAT_SECONDS.observe
_counters = {f.name: metrics.MESSAGES.labels(kind=f.name)
             for f in pb.AgentMessage.DESCRIPTOR.oneofs_by_name["body"].fields}


def _count(kind: str | None) -> None:
    counter = _counters.get(kind or "")
    if counter is not None:  # a kind from a newer agent is not a label: it could mint series
        counter.inc()


def _reuse_gpus(new: tuple[Gpu, ...], held: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """``new``, made of the objects ``held`` already has wherever they are equal."""
    if new == held:
        return held
    if len(new) != len(held):
        return new
    return tuple(h if g == h else dataclasses.replace(g, processes=h.processes) if g.processes == h.processes
                 else g for g, h in zip(new, held, strict=True))
