"""Agent links: the stream to each connected agent, its heartbeat clock, and everything sent down it.

One registry, ``node id -> link``: a newer stream from the same node replaces (and closes) the older one, a
silent one is closed once its heartbeat is overdue (``update``), a step-down closes them all. Commands,
the control planes' addresses, log requests and a revocation's close all go through here; a command for a
node that is not connected is dropped, and the next pass sends it again once the node is back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from llmgw.control import events as ev
from llmgw.control.loop.context import LoopContext
from llmgw.control.loop.recorder import Recorder
from llmgw.core import fabrictest
from llmgw.core.provision import Provision
from llmgw.core.shards import ShardSpec

log = logging.getLogger(__name__)


class AgentLink(Protocol):
    """The stream to one agent, as the agent service provides it."""

    def start_shard(self, spec: ShardSpec) -> None: ...
    def stop_shard(self, shard_id: str, *, reason: str) -> None: ...
    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None: ...
    def remove_weights(self, cache_name: str) -> None: ...
    def sleep_shard(self, shard_id: str, *, level: int) -> None: ...
    def provision(self, provision: Provision) -> None: ...
    def controlplanes(self, addrs: tuple[str, ...]) -> None: ...
    def close(self, reason: str) -> None: ...
    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> tuple[str, asyncio.Queue[Any]]: ...
    def cancel_logs(self, request_id: str) -> None: ...
    def fabric_test(self, req: fabrictest.FabricTestRequest) -> asyncio.Future[fabrictest.FabricTestResult]: ...
    def forget_fabric_test(self, test_id: str) -> None: ...
    def upgrade_agent(self, *, id: str, version: str, index_url: str, find_links: bool) -> None: ...  # noqa: A002


class NodeNotConnected(Exception):
    pass


class LogsError(Exception):
    """The agent could not answer a logs request; the message says why."""


@dataclasses.dataclass(slots=True)
class _Conn:
    link: AgentLink
    last_heartbeat: float


class Links:
    def __init__(self, ctx: LoopContext, recorder: Recorder, *, heartbeat_timeout_s: float,
                 known: Callable[[str], bool], silent: Callable[[str, AgentLink], None]) -> None:
        self._ctx, self._recorder = ctx, recorder
        self.heartbeat_timeout_s = heartbeat_timeout_s
        #: Whether a node is known at all (registered once, or in the store); ``silent``: a stream closed for
        #: its overdue heartbeat, to be told as the node's disconnection.
        self._known, self._silent = known, silent
        self._conns: dict[str, _Conn] = {}
        #: The Provision last sent on each node's current stream: sent again only when it changes.
        self.provisioned: dict[str, Provision] = {}
        #: The control planes' addresses as last sent to the connected agents (``announce_peers``).
        self._peers: tuple[str, ...] = ()

    def register(self, node_id: str, link: AgentLink) -> None:
        old = self._conns.get(node_id)
        if old is not None and old.link is not link:
            old.link.close("replaced by a newer stream from the same node")
        self._conns[node_id] = _Conn(link, self._ctx.clock())
        self.provisioned.pop(node_id, None)  # a new stream: the next pass sends it its Provision

    def beat(self, node_id: str) -> bool:
        """Notes a heartbeat on the node's stream; False when it has none."""
        conn = self._conns.get(node_id)
        if conn is None:
            return False
        conn.last_heartbeat = self._ctx.clock()
        return True

    def drop(self, node_id: str, link: AgentLink) -> bool:
        """Forgets the node's stream if it is ``link``; False for an older stream ending after a newer one."""
        conn = self._conns.get(node_id)
        if conn is None or conn.link is not link:
            return False
        del self._conns[node_id]
        return True

    def close_all(self, reason: str) -> None:
        for conn in list(self._conns.values()):
            conn.link.close(reason)
        self._conns.clear()
        self.provisioned = {}

    def connected(self, node_id: str) -> bool:
        return node_id in self._conns

    def link(self, node_id: str) -> AgentLink | None:
        """The stream to a connected node, for a request that awaits its answer (a fabric test); None if not."""
        conn = self._conns.get(node_id)
        return conn.link if conn is not None else None

    def send(self, node_id: str, fn: Callable[[AgentLink], None]) -> None:
        conn = self._conns.get(node_id)
        if conn is not None:  # otherwise the next pass sends it again once the node is back
            fn(conn.link)

    def update(self, now: float) -> None:
        """Closes the streams whose heartbeat is overdue; each is told as its node's disconnection."""
        # Only the silent ones are copied out: a copy of every connection, each pass, held the
        # loop 15 ms a pass with 10,000 agents (bench/fleet.py), garbage collections included.
        limit = now - self.heartbeat_timeout_s
        silent = [(node_id, conn) for node_id, conn in self._conns.items() if conn.last_heartbeat < limit]
        for node_id, conn in silent:
            if now - conn.last_heartbeat > self.heartbeat_timeout_s:
                log.warning("node %s sent nothing for %.0fs; closing its stream", node_id,
                            now - conn.last_heartbeat)
                conn.link.close("no heartbeat")
                self._silent(node_id, conn.link)

    def announce_peers(self) -> None:
        """Tells every connected agent the control planes' addresses when they changed (a standby started
        after the agents registered): an agent that knew only the leader would otherwise never find the
        standby when the leader dies, and its engines would be replaced after its grace."""
        peers = self._ctx.hint()[1]
        if not self._ctx.leading or peers == self._peers:
            return
        self._peers = peers
        for conn in self._conns.values():
            conn.link.controlplanes(peers)

    async def revoke(self, node_id: str) -> int:
        """Revokes every certificate of ``node_id`` and closes its stream now; returns how many were revoked.

        The row first, then the close: the agent's next Connect (it redials at once) meets the revocation
        in the store and is refused there, so nothing is left for a timer to cut off.
        """
        at = self._ctx.clock()
        count = await self._ctx.call(self._ctx.store.revoke_node_certs, node_id, at=at)
        conn = self._conns.get(node_id)
        if conn is not None:
            conn.link.close(f"its certificate was revoked ({count} revoked)")
        self._recorder.record(ev.Event(at, ev.WARNING, "NodeRevoked", f"node/{node_id}",
                                       f"{count} certificate(s) revoked; the node is refused until it joins again",
                                       node=node_id))
        self._recorder.flush()
        return count

    async def logs(self, node_id: str, shard_id: str, *, lines: int, follow: bool) -> AsyncIterator[list[str]]:
        """Lines of a node's agent log or of one of its shards, read over the node's stream."""
        conn = self._conns.get(node_id)
        if conn is None:
            if self._known(node_id):
                raise NodeNotConnected(f"node {node_id} is not connected now; its logs are on the node itself")
            raise KeyError(node_id)
        request_id, replies = conn.link.request_logs(shard_id, lines=lines, follow=follow)
        try:
            while True:
                batch = await replies.get()
                if batch.error:
                    raise LogsError(batch.error)
                yield list(batch.lines)
                if batch.done:
                    return
        finally:
            conn.link.cancel_logs(request_id)
