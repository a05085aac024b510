"""The agent stream's server end: one ``Connect`` call per connected agent.

Protobuf stops here: messages are converted to core types on arrival and
handed to the cluster; commands from the cluster are converted on the way out.
Each stream has an outgoing queue, so a command never waits on the network
while the reconcile loop runs. Heartbeats are counted and timed here
(``metrics``); ``bench/fleet.py`` reads those with 10,000 simulated agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple

import grpc
from google.protobuf import message as pb_message

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.control.agentsvc import collector, metrics
from llmgw.control.cluster import Cluster
from llmgw.control.store.store import StoredNode
from llmgw.core.shards import ShardSpec

log = logging.getLogger(__name__)
REGISTER_TIMEOUT_S = 10.0

#: Keepalive pings find a peer that vanished without closing (a powered-off
#: node), which otherwise holds a stream open until TCP gives up, for minutes.
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
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

    def __init__(self, node_id: str, *, peer: str = "") -> None:
        self.node_id = node_id
        self.peer = peer
        self.error = ""  # why the server ends the stream, for the peer; empty for a plain end
        self.queue: asyncio.Queue[pb.ControlMessage | None] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._logs: dict[str, asyncio.Queue[LogBatch]] = {}

    def _put(self, **body: object) -> None:
        self.queue.put_nowait(pb.ControlMessage(seq=next(self._seq), **body))

    def start_shard(self, spec: ShardSpec) -> None:
        self._put(start_shard=pb.StartShard(spec=convert.spec_to_pb(spec)))

    def stop_shard(self, shard_id: str, *, reason: str) -> None:
        self._put(stop_shard=pb.StopShard(shard_id=shard_id, reason=reason))

    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None:
        self._put(drain=pb.Drain(shard_id=shard_id, timeout_s=timeout_s))

    def remove_weights(self, cache_name: str) -> None:
        self._put(remove_weights=pb.RemoveWeights(cache_name=cache_name))

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

    def ack(self, seq: int, *, ok: bool, error: str = "") -> None:
        self._put(ack=pb.Ack(seq=seq, ok=ok, error=error))

    def close(self, reason: str) -> None:
        log.info("closing stream of node %s: %s", self.node_id, reason)
        self.queue.put_nowait(None)


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        #: The stream each node id holds now. A Register for one of these is refused: before,
        #: it replaced the stream, so any process that named a connected node took its place
        #: and received its StartShards (issue 13).
        self._live: dict[str, _Link] = {}

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
        refusal = _check_register(first) or self._check_not_connected(first.register.node_id, peer)
        if refusal:
            log.warning("refused agent at %s: %s", peer, refusal)
            yield pb.ControlMessage(seq=0, ack=pb.Ack(seq=first.seq, ok=False, error=refusal))
            return
        reg = first.register
        link = _Link(reg.node_id, peer=peer)
        now = self.cluster.clock()
        node = StoredNode(
            id=reg.node_id, hostname=reg.hostname or reg.node_id, mgmt_addr=reg.mgmt_addr,
            agent_version=reg.agent_version, inventory=convert.inventory_from_register(reg),
            labels=dict(reg.labels), first_seen=now, last_seen=now)
        link.ack(first.seq, ok=True)
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
        elif kind == "logs_reply":
            link.logs_reply(msg.logs_reply)
        elif kind == "ack":
            if not msg.ack.ok:
                log.warning("node %s refused command %d: %s", link.node_id, msg.ack.seq, msg.ack.error)
        elif kind == "register":
            log.warning("node %s sent a second Register on one stream; ignored", link.node_id)
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


async def serve(cluster: Cluster, *, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Starts the gRPC server; returns it and the port it bound (``port`` 0 picks a free one)."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(cluster), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio >= 1.6x raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for agents on {host}:{port}: the port is in use or the address "
                      "is not this machine's; pass --agent-port")
    await server.start()
    return server, bound
