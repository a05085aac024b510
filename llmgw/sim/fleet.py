"""The fleet simulator: many fake agents in one process, on real gRPC streams to a real control plane.

Each simulated node registers a made-up inventory (8×H100 with NVLink, 4×L40S,
or CPU-only), heartbeats, and answers commands as an agent would, except that
a shard is Ready at once and no engine process exists. That is enough to
exercise placement and reconciliation at a scale this machine cannot host for
real. Endpoints point at a closed port: routing to a simulated shard fails, so
the simulator is for the control plane, not the router.

It is built to cost as little per node as it can, so that with thousands of
nodes on one core it is the control plane that is measured:

* Streams share a few channels (HTTP/2 multiplexes them), because a thousand
  TCP connections from one process only measure the kernel.
* A heartbeat is serialized once per node kind and sent as bytes with only the
  seq in front (protobuf concatenation merges fields), so a beat costs one
  small bytes join instead of building eight ``Gpu`` messages.
* Heartbeats are spread evenly over the period, node ``i`` of ``n`` at
  ``i/n`` of it, on an absolute schedule, so the control plane sees a steady
  rate and no drift bunches them up. How late each beat went out is counted
  (``Stats.late``): when the simulator itself cannot keep up, that shows it.
* Several control planes (``--server A,B``): the channels to each are made
  once for the fleet (a ``Route``) and a node holds only the index of the
  server it dials, so a node costs the same whatever their number. A Register
  refused naming the leader (``Ack.leader``, a standby's answer) is followed
  at once when the leader is one of the given servers; any other refusal, an
  error or a closed stream moves the node to the next server after the usual
  short sleep. Commands keep being counted (``Stats.starts``...), so a failover
  bench can show none arrived after it.
* Identity (``identity``): against a secure control plane each node joins with the one many-use token
  and dials the agent port with mutual TLS on a channel of its own (a connection carries one client
  certificate, so the shared channels above are for ``--insecure`` only), and renews its certificate
  over its stream when it asks for it. One expiry check per heartbeat is a float comparison.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import grpc

from llmgw.agent import session
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core.inventory import Gpu, Inventory
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.sim import identity as identity_mod

log = logging.getLogger(__name__)
GIB = 2**30
STREAMS_PER_CHANNEL = 100
CONNECT_METHOD = "/llmgw.v1.AgentService/Connect"
#: Upper bounds (seconds) of the lateness histogram; the last bucket is everything above.
LATE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def _gpus(n: int, name: str, mem_gib: int, cc: str, *, nvlink: bool) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-sim-{name}-{i}", name, mem_gib * GIB, 0, cc,
                     nvlink_peers=tuple(j for j in range(n) if j != i) if nvlink else ()) for i in range(n))


KINDS: dict[str, Inventory] = {
    "h100": Inventory(cpu_count=192, memory_total_bytes=2048 * GIB, memory_available_bytes=1900 * GIB,
                      gpus=_gpus(8, "NVIDIA H100 80GB HBM3", 80, "9.0", nvlink=True),
                      engines=(("sim", "fleet"), ("vllm", "0.11.0"), ("sglang", "0.5.0"))),
    "l40s": Inventory(cpu_count=64, memory_total_bytes=512 * GIB, memory_available_bytes=480 * GIB,
                      gpus=_gpus(4, "NVIDIA L40S", 48, "8.9", nvlink=False),
                      engines=(("sim", "fleet"), ("vllm", "0.11.0"))),
    "cpu": Inventory(cpu_count=32, memory_total_bytes=128 * GIB, memory_available_bytes=120 * GIB,
                     engines=(("sim", "fleet"), ("llamacpp", "fleet"))),
}


def parse_mix(text: str) -> list[tuple[str, float]]:
    """``"h100:0.5,l40s:0.3,cpu:0.2"`` -> weights; names must be in KINDS."""
    out = []
    for part in text.split(","):
        name, _, weight = part.strip().partition(":")
        if name not in KINDS:
            raise ValueError(f"unknown node kind {name!r} in --mix; known: {', '.join(KINDS)}")
        try:
            w = float(weight or 1)
        except ValueError:
            raise ValueError(f"--mix {part!r}: the weight must be a number") from None
        if w < 0:
            raise ValueError(f"--mix {part!r}: the weight must not be negative")
        out.append((name, w))
    if not any(w > 0 for _, w in out):
        raise ValueError(f"--mix {text!r}: at least one weight must be above 0")
    return out


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


def _heartbeat_tail(inv: Inventory) -> bytes:
    return pb.AgentMessage(heartbeat=pb.Heartbeat(
        memory_total_bytes=inv.memory_total_bytes, memory_available_bytes=inv.memory_available_bytes,
        gpus=convert.gpus_to_pb(inv.gpus))).SerializeToString()


def parse_servers(text: str) -> tuple[str, ...]:
    """``"HOST:PORT,HOST:PORT"`` -> the addresses, in order, deduplicated; each must have a port 1-65535."""
    out: list[str] = []
    for part in text.split(","):
        addr = part.strip()
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in addr):
            raise ValueError(f"--server {addr!r} is not HOST:PORT (a port 1-65535); give one or more, comma-separated")
        if addr not in out:
            out.append(addr)
    return tuple(out)


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
        self._tail = heartbeat_tail if heartbeat_tail is not None else _heartbeat_tail(inventory)
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
            shards=[convert.status_to_pb(s) for s in self.shards.values()],
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


def build_fleet(n: int, mix: list[tuple[str, float]], *, heartbeat_s: float, stats: Stats,
                seed: int = 0, prefix: str = "sim") -> list[FakeAgent]:
    rng = random.Random(seed)
    names, weights = zip(*mix, strict=True)
    tails = {name: _heartbeat_tail(KINDS[name]) for name in names}
    agents = []
    for i in range(n):
        kind = rng.choices(names, weights)[0]
        agents.append(FakeAgent(f"{prefix}-{i:05d}", KINDS[kind], heartbeat_s=heartbeat_s, stats=stats,
                                phase=i / n, heartbeat_tail=tails[kind]))
    return agents


def snapshot(agents: list[FakeAgent], stats: Stats, *, started: float) -> dict[str, Any]:
    """What the simulator has seen so far, as written to ``--stats-file``."""
    return {"nodes": len(agents), "shards_ready": sum(
                1 for a in agents for s in a.shards.values() if s.state is ShardState.READY),
            "time": time.time(), "uptime_s": round(time.monotonic() - started, 3), "pid": os.getpid(),
            "late_buckets": list(LATE_BUCKETS), **dataclasses.asdict(stats)}


def _write_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # a reader never sees half a file


async def run(servers: str | tuple[str, ...], agents: list[FakeAgent], *, stop: asyncio.Event,
              report_s: float = 5.0, stats_file: Path | None = None, stats_every_s: float = 0.5,
              streams_per_channel: int = STREAMS_PER_CHANNEL, ca_pem: bytes | None = None,
              dial_in_flight: int = 0) -> None:
    """Runs ``agents`` against ``servers`` (one address, or several: node ``i`` starts at the first) until ``stop``.

    With ``ca_pem`` (the cluster's CA) every agent dials with mutual TLS, with its ``identity``.
    """
    addrs = (servers,) if isinstance(servers, str) else tuple(servers)
    n_channels = 0 if ca_pem is not None else max(1, -(-len(agents) // streams_per_channel))
    # The real agent's channel options: a restarted control plane is redialled within a second.
    channels = [[grpc.aio.insecure_channel(addr, options=session.CHANNEL_OPTIONS) for _ in range(n_channels)]
                for addr in addrs]
    route = Route(addrs, channels, ca_pem=ca_pem, dial_in_flight=dial_in_flight)
    tasks = [asyncio.create_task(a.run(route, stop, slot=i)) for i, a in enumerate(agents)]
    stats = agents[0].stats if agents else Stats()
    t0 = time.monotonic()
    next_report = t0 + report_s
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), stats_every_s if stats_file else report_s)
            except TimeoutError:
                pass
            if stats_file is not None:
                _write_atomic(stats_file, snapshot(agents, stats, started=t0))
            if time.monotonic() >= next_report:
                next_report += report_s
                log.info("fleet: %d/%d registered, %d shards, %d starts, %d stops, %d heartbeats, %.0fs%s",
                         stats.registered, len(agents), sum(len(a.shards) for a in agents), stats.starts,
                         stats.stops, stats.heartbeats, time.monotonic() - t0,
                         f"; last error: {stats.last_error}" if stats.registered < len(agents) and stats.last_error
                         else "")
    finally:
        if stats_file is not None:
            _write_atomic(stats_file, snapshot(agents, stats, started=t0))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.close_channel() for a in agents), return_exceptions=True)
        for chs in channels:
            for ch in chs:
                await ch.close()
