"""The fleet simulator: many fake agents in one process, on real gRPC streams to a real control plane.

Each simulated node registers a made-up inventory (8×H100 with NVLink, 4×L40S,
or CPU-only), heartbeats, and answers commands as an agent would, except that
a shard is Ready at once and no engine process exists. That is enough to
exercise placement and reconciliation at a scale this machine cannot host for
real. Endpoints point at a closed port: routing to a simulated shard fails, so
the simulator is for the control plane, not the router.

Streams share a few channels (HTTP/2 multiplexes them), because a thousand
TCP connections from one process only measure the kernel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import time

import grpc

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core.inventory import Gpu, Inventory
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)
GIB = 2**30
STREAMS_PER_CHANNEL = 100


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
        out.append((name, w))
    return out


@dataclasses.dataclass
class Stats:
    registered: int = 0
    starts: int = 0
    stops: int = 0
    drains: int = 0
    heartbeats: int = 0
    errors: int = 0


class FakeAgent:
    def __init__(self, node_id: str, inventory: Inventory, *, heartbeat_s: float, stats: Stats) -> None:
        self.node_id, self.inventory, self.heartbeat_s, self.stats = node_id, inventory, heartbeat_s, stats
        self.shards: dict[str, ShardStatus] = {}
        self._seq = itertools.count(1)
        self._ports = itertools.count(20000)

    def _msg(self, **body: object) -> pb.AgentMessage:
        return pb.AgentMessage(seq=next(self._seq), **body)  # type: ignore[arg-type]

    def _status(self, spec: ShardSpec, state: ShardState, message: str = "") -> ShardStatus:
        # Port 9 (discard) on loopback: nothing answers, which is the point.
        st = ShardStatus(spec.shard_id, spec.replica_id, state, message=message,
                         endpoint="http://127.0.0.1:9", pid=0, spec=spec)
        self.shards[spec.shard_id] = st
        return st

    async def run(self, channel: grpc.aio.Channel, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._session(channel, stop)
            except grpc.aio.AioRpcError as e:
                self.stats.errors += 1
                log.debug("%s: %s", self.node_id, e.code().name)
            await asyncio.sleep(0.5 + random.random())

    async def _session(self, channel: grpc.aio.Channel, stop: asyncio.Event) -> None:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
        await call.write(self._msg(register=pb.Register(
            node_id=self.node_id, hostname=self.node_id, agent_version="fleet-sim", mgmt_addr="127.0.0.1",
            shards=[convert.status_to_pb(s) for s in self.shards.values()],
            **convert.register_fields(self.inventory))))  # type: ignore[arg-type]
        first = await call.read()
        if first is grpc.aio.EOF or not first.ack.ok:
            return
        self.stats.registered += 1
        beat = asyncio.create_task(self._beat(call))
        try:
            while not stop.is_set():
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    return
                await self._handle(call, msg)
        finally:
            beat.cancel()
            self.stats.registered -= 1
            call.cancel()

    async def _beat(self, call: grpc.aio.StreamStreamCall) -> None:
        await asyncio.sleep(random.random() * self.heartbeat_s)  # spread the fleet's heartbeats
        inv = self.inventory
        while True:
            await call.write(self._msg(heartbeat=pb.Heartbeat(
                memory_total_bytes=inv.memory_total_bytes, memory_available_bytes=inv.memory_available_bytes,
                gpus=convert.gpus_to_pb(inv.gpus))))
            self.stats.heartbeats += 1
            await asyncio.sleep(self.heartbeat_s)

    async def _handle(self, call: grpc.aio.StreamStreamCall, msg: pb.ControlMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind == "start_shard":
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
                seed: int = 0) -> list[FakeAgent]:
    rng = random.Random(seed)
    names, weights = zip(*mix, strict=True)
    return [FakeAgent(f"sim-{i:05d}", KINDS[rng.choices(names, weights)[0]], heartbeat_s=heartbeat_s, stats=stats)
            for i in range(n)]


async def run(server: str, agents: list[FakeAgent], *, stop: asyncio.Event, report_s: float = 5.0) -> None:
    channels = [grpc.aio.insecure_channel(server) for _ in range(max(1, len(agents) // STREAMS_PER_CHANNEL))]
    tasks = [asyncio.create_task(a.run(channels[i % len(channels)], stop)) for i, a in enumerate(agents)]
    stats = agents[0].stats if agents else Stats()
    t0 = time.monotonic()
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), report_s)
            except TimeoutError:
                pass
            log.info("fleet: %d/%d registered, %d shards Ready, %d starts, %d stops, %d heartbeats, %.0fs",
                     stats.registered, len(agents), sum(len(a.shards) for a in agents), stats.starts, stats.stops,
                     stats.heartbeats, time.monotonic() - t0)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()
