"""One agent's stream as the cluster holds it: the commands it sends, and the answers it waits for.

The cluster calls a ``Link`` through its ``AgentLink`` protocol; each call puts a ControlMessage, numbered and
carrying the leader's term, on the stream's outgoing queue, so a command never waits on the network while the
reconcile loop runs. Log requests and fabric tests are answered later on the stream: their replies are routed
back here by request or test id, and a stream that ends answers whoever still waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import NamedTuple

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import fabrictest as ft
from llmgw.core.provision import Provision
from llmgw.core.shards import ShardSpec

log = logging.getLogger(__name__)


class LogBatch(NamedTuple):
    lines: tuple[str, ...]
    error: str
    done: bool


class Link:
    """The cluster's handle on one stream: what it sends the agent (its ``AgentLink``), and the answers it
    waits for (log replies, fabric test results)."""

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

    def sleep_shard(self, shard_id: str, *, level: int) -> None:
        """Put the shard's engine to sleep at ``level`` (1, 2), or wake it (0): issue 31, spec.idle."""
        self._put(sleep_shard=pb.SleepShard(shard_id=shard_id, level=level))

    def remove_weights(self, cache_name: str) -> None:
        self._put(remove_weights=pb.RemoveWeights(cache_name=cache_name))

    def provision(self, provision: Provision) -> None:
        self._put(provision=convert.provision_to_pb(provision))

    def upgrade_agent(self, *, id: str, version: str, index_url: str, find_links: bool) -> None:  # noqa: A002
        self._put(upgrade_agent=pb.UpgradeAgent(id=id, version=version, index_url=index_url, find_links=find_links))

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

    def tunnel_offer(self, port: int) -> None:
        """Issue 33: the tunnel port this node's agent dials (``agent.tunnel``)."""
        self._put(tunnel_offer=pb.TunnelOffer(port=port))

    def controlplanes(self, addrs: tuple[str, ...]) -> None:
        self._put(controlplanes=pb.ControlPlanes(addrs=addrs))

    def cert_issued(self, *, cert_pem: bytes = b"", error: str = "", purpose: int = pb.CERT_PURPOSE_NODE) -> None:
        self._put(cert_issued=pb.CertIssued(cert_pem=cert_pem, error=error, purpose=purpose))  # type: ignore[arg-type]

    def ack(self, seq: int, *, ok: bool, error: str = "", controlplanes: tuple[str, ...] = (), protocol: int = 0,
            server_version: str = "") -> None:
        """``protocol``/``server_version``: the control plane's, on a Register's answer (``core.skew``)."""
        self._put(ack=pb.Ack(seq=seq, ok=ok, error=error, term=self.term, controlplanes=controlplanes,
                             protocol=protocol, server_version=server_version))

    def close(self, reason: str) -> None:
        log.info("closing stream of node %s: %s", self.node_id, reason)
        self.queue.put_nowait(None)
