"""One simulated agent: its stream to a control plane, as cheap per node as it can be.

A ``FakeAgent`` registers, heartbeats on its phase of the period, and answers commands as an agent would,
except that a shard is Ready at once and no engine process exists. A ``Route`` holds what every node of the
fleet shares: the control planes' addresses and a few channels to each (HTTP/2 multiplexes the streams).
The fleet's counters (``Stats``) are shared too: one object, counted into by every node.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import logging
import random
import time
from typing import Any

import grpc

from llmgw.agent import session
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import skew
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.sim import identity as identity_mod

log = logging.getLogger(__name__)
CONNECT_METHOD = "/llmgw.v1.AgentService/Connect"
#: Upper bounds (seconds) of the lateness histogram; the last bucket is everything above.
LATE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclasses.dataclass
class Stats:
    registered: int = 0
    #: Streams accepted so far, reconnections included.
    sessions: int = 0
    starts: int = 0
    stops: int = 0
    drains: int = 0
    heartbeats: int = 0
    errors: int = 0
    #: Registers refused naming the leader and followed there at once (a standby's answer).
    redirects: int = 0
    #: Nodes that joined in this run (secure fleets), and how long joining them all took.
    joined: int = 0
    join_s: float = 0.0
    #: Certificates renewed over the stream, and renewals the control plane refused.
    renewed: int = 0
    renew_errors: int = 0
    #: The last stream error (code and details), for the log when nodes do not register.
    last_error: str = ""
    #: Heartbeats by how late they went out against their schedule (LATE_BUCKETS, then one above).
    late: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(LATE_BUCKETS) + 1))

    def count_late(self, seconds: float) -> None:
        self.late[bisect.bisect_left(LATE_BUCKETS, seconds)] += 1


class Route:
    """Where a fleet dials: each control plane's address and a few channels to it, shared by every node.

    A node holds only the index of the server it dials and its own slot (which channel of that server it
    uses), so a second control plane costs the fleet a few channels, not anything per node.
    """

    def __init__(self, servers: tuple[str, ...], channels: list[list[grpc.aio.Channel]], *,
                 ca_pem: bytes | None = None, dial_in_flight: int = 0) -> None:
        self.servers = servers
        #: The cluster CA when nodes dial with mutual TLS, each on its own channel (then ``channels`` is empty).
        self.ca_pem = ca_pem
        #: Registrations in flight at most (None: no bound), from the dial to the Register's answer.
        self.dialing = asyncio.Semaphore(dial_in_flight) if dial_in_flight else None
        self.index = {addr: i for i, addr in enumerate(servers)}
        # One multicallable per channel (bytes as they are on the way out), not one per node.
        self.connects = [[ch.stream_stream(CONNECT_METHOD, request_serializer=None,
                                           response_deserializer=pb.ControlMessage.FromString) for ch in chs]
                         for chs in channels]

    def connect(self, server: int, slot: int) -> Any:
        chans = self.connects[server]
        return chans[slot % len(chans)]

    def tls_connect(self, server: int, ident: identity_mod.Identity) -> tuple[grpc.aio.Channel, Any]:
        """A channel of one node's own to ``server``, with its certificate, and its Connect multicallable."""
        assert self.ca_pem is not None
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca_pem, private_key=ident.key_pem,
                                             certificate_chain=ident.cert_pem)
        channel = grpc.aio.secure_channel(self.servers[server], creds, options=session.CHANNEL_OPTIONS)
        return channel, channel.stream_stream(CONNECT_METHOD, request_serializer=None,
                                              response_deserializer=pb.ControlMessage.FromString)


class RegisterTimeout(Exception):
    """The Register went unanswered for ``session.REGISTER_TIMEOUT_S``."""


class FakeAgent:
    #: Seconds slept (plus up to as much again, at random) before dialling the next server after a failure.
    retry_s = 0.5
    #: After failures to connect in a row, the sleep doubles up to this, as the real agent's backoff does
    #: (``session.run_forever``): 10,000 TLS nodes retrying every 0.5-1 s kept a loaded control plane
    #: handshaking the retries of nodes that had given up, and none registered (measured, 2 cores).
    retry_max_s = 15.0

    def __init__(self, node_id: str, inventory: Inventory, *, heartbeat_s: float, stats: Stats,
                 phase: float = 0.0, heartbeat_tail: bytes | None = None) -> None:
        self.node_id, self.inventory, self.heartbeat_s, self.stats = node_id, inventory, heartbeat_s, stats
        #: Where in the heartbeat period this node beats, as a fraction of it.
        self.phase = phase
        self.shards: dict[str, ShardStatus] = {}
        self._seq = itertools.count(1)
        self._tail = heartbeat_tail if heartbeat_tail is not None else heartbeat_tail(inventory)
        #: The node's key and certificate (None: it dials plaintext, --insecure).
        self.identity: identity_mod.Identity | None = None
        #: Its own channel while it dials with TLS: the server index and certificate it was made for.
        self.channel: grpc.aio.Channel | None = None
        self._channel_for: tuple[int, bytes] = (-1, b"")
        self._connect: Any = None
        self._renewing = False
        self._registered = False

    def _msg(self, **body: object) -> bytes:
        return pb.AgentMessage(seq=next(self._seq), **body).SerializeToString()  # type: ignore[arg-type]

    def _status(self, spec: ShardSpec, state: ShardState, message: str = "") -> ShardStatus:
        # Port 9 (discard) on loopback: nothing answers, which is the point.
        st = ShardStatus(spec.shard_id, spec.replica_id, state, message=message,
                         endpoint="http://127.0.0.1:9", pid=0, spec=spec)
        self.shards[spec.shard_id] = st
        return st

    async def run(self, route: Route, stop: asyncio.Event, *, slot: int = 0, server: int = 0) -> None:
        """Keeps a session with one of ``route``'s servers, starting with ``server``, until ``stop``."""
        at, followed, delay, fails = server % len(route.servers), False, self.retry_s, 0
        while not stop.is_set():
            leader, failed, self._registered = "", False, False
            try:
                leader = await self._session(await self._dial(route, at, slot), stop, route.dialing)
            except grpc.aio.AioRpcError as e:
                failed = True
                self.stats.errors += 1
                self.stats.last_error = f"{e.code().name}: {e.details()}"
                log.debug("%s: %s", self.node_id, e.code().name)
            except RegisterTimeout as e:
                failed = True
                self.stats.errors += 1
                self.stats.last_error = str(e)
            if self._registered or not failed:
                delay, fails = self.retry_s, 0  # a session, or a refusal (a standby answers): no backoff
            else:
                fails += 1
                if fails % len(route.servers) == 0:  # every server failed once more: back off further
                    delay = min(delay * 2, self.retry_max_s)
            to = route.index.get(leader, -1) if leader else -1
            if to >= 0:
                at = to
                # The leader dialled at once, unless this refusal came from the leader just followed: two
                # standbys naming each other (stale views mid-takeover) must not spin without a pause.
                if not followed:
                    followed = True
                    self.stats.redirects += 1
                    continue
            else:
                at = (at + 1) % len(route.servers)
            followed = False
            await asyncio.sleep(delay * (1 + random.random()))

    async def _dial(self, route: Route, at: int, slot: int) -> Any:
        """The Connect multicallable to server ``at``: a shared channel's, or (TLS) this node's own channel's,
        made anew when the server or the certificate (renewed) changed since it was made."""
        ident = self.identity
        if route.ca_pem is None or ident is None:
            return route.connect(at, slot)
        if self._channel_for != (at, ident.cert_pem):
            await self.close_channel()
            self.channel, self._connect = route.tls_connect(at, ident)
            self._channel_for = (at, ident.cert_pem)
        return self._connect

    async def close_channel(self) -> None:
        if self.channel is not None:
            channel, self.channel, self._channel_for = self.channel, None, (-1, b"")
            await channel.close()

    async def _session(self, connect: Any, stop: asyncio.Event, gate: asyncio.Semaphore | None = None) -> str:
        """One stream, until it ends; the leader's address when the Register was refused naming one, else "".

        ``gate`` bounds the fleet's registrations in flight (``--dial-in-flight``): it is held from the dial
        to the Register's answer.
        """
        call = connect()
        try:
            if gate is None:
                first = await asyncio.wait_for(self._register(call), session.REGISTER_TIMEOUT_S)
            else:
                async with gate:
                    first = await asyncio.wait_for(self._register(call), session.REGISTER_TIMEOUT_S)
        except TimeoutError:
            # As the real agent: a Register unanswered in 10 s (a handshake that never ends on a swamped
            # server) is a failure, not a wait for good; it held a --dial-in-flight slot for good too.
            call.cancel()
            raise RegisterTimeout(f"no answer to Register within {session.REGISTER_TIMEOUT_S:.0f}s") from None
        if first is grpc.aio.EOF:
            return ""
        self._registered = first.ack.ok
        if not first.ack.ok:
            self.stats.last_error = f"Register refused: {first.ack.error}"
            call.cancel()
            return str(first.ack.leader)
        self._renewing = False  # an answer the last stream never got must not block renewal for good
        self.stats.registered += 1
        self.stats.sessions += 1
        beat = asyncio.create_task(self._beat(call))
        try:
            while not stop.is_set():
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    return ""
                await self._handle(call, msg)
        finally:
            beat.cancel()
            self.stats.registered -= 1
            call.cancel()
        return ""

    async def _register(self, call: Any) -> Any:
        await call.write(self._msg(register=pb.Register(
            node_id=self.node_id, hostname=self.node_id, agent_version="fleet-sim", mgmt_addr="127.0.0.1",
            protocol=skew.PROTOCOL, shards=[convert.status_to_pb(s) for s in self.shards.values()],
            **convert.register_fields(self.inventory))))  # type: ignore[arg-type]
        return await call.read()

    async def _beat(self, call: grpc.aio.StreamStreamCall) -> None:
        loop = asyncio.get_running_loop()
        period = self.heartbeat_s
        now = loop.time()
        # The next moment at this node's phase of the period, on a clock shared by the
        # whole fleet, so the streams of a restarted control plane keep their spread.
        due = (now // period) * period + self.phase * period
        if due <= now:
            due += period
        tail, stats, ident = self._tail, self.stats, self.identity
        while True:
            await asyncio.sleep(due - loop.time())
            stats.count_late(loop.time() - due)
            if ident is not None and not self._renewing and time.time() >= ident.renew_at:
                # As the real agent: one RenewCert at a time, at a heartbeat once the certificate is due.
                self._renewing = True
                await call.write(self._msg(renew_cert=pb.RenewCert(csr_pem=ident.csr(self.node_id))))
            await call.write(pb.AgentMessage(seq=next(self._seq)).SerializeToString() + tail)
            stats.heartbeats += 1
            due += period
            now = loop.time()
            if due < now:  # more than a period behind: skip beats rather than send a burst
                due += ((now - due) // period + 1) * period

    async def _handle(self, call: grpc.aio.StreamStreamCall, msg: pb.ControlMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind == "cert_issued":
            self._renewing = False
            if msg.cert_issued.error or self.identity is None:
                self.stats.renew_errors += 1
                self.stats.last_error = f"renewal refused: {msg.cert_issued.error}"
            else:
                self.identity.renewed(msg.cert_issued.cert_pem)  # the next connection uses it
                self.stats.renewed += 1
        elif kind == "start_shard":
            spec = convert.spec_from_pb(msg.start_shard.spec)
            self.stats.starts += 1
            known = self.shards.get(spec.shard_id)
            st = known if known is not None else self._status(spec, ShardState.READY, "simulated")
            await call.write(self._msg(shard_status=convert.status_to_pb(st)))
        elif kind in ("stop_shard", "drain"):
            shard_id = msg.stop_shard.shard_id if kind == "stop_shard" else msg.drain.shard_id
            known = self.shards.get(shard_id)
            if known is None or known.spec is None:
                st = ShardStatus(shard_id, "", ShardState.STOPPED)
            else:
                state = ShardState.STOPPED if kind == "stop_shard" else ShardState.DRAINED
                st = self._status(known.spec, state)
            if kind == "stop_shard":
                self.stats.stops += 1
                self.shards.pop(shard_id, None)
            else:
                self.stats.drains += 1
            await call.write(self._msg(shard_status=convert.status_to_pb(st)))
