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

A node is a ``fakeagent.FakeAgent``, its inventory one of ``kinds.KINDS``; this module builds a fleet of them
and runs it, writing what it has seen to ``--stats-file``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import grpc

from llmgw.agent import session
from llmgw.core.shards import ShardState
from llmgw.sim.fakeagent import LATE_BUCKETS, FakeAgent, Route, Stats
from llmgw.sim.kinds import KINDS, heartbeat_tail, parse_mix

__all__ = ["KINDS", "LATE_BUCKETS", "STREAMS_PER_CHANNEL", "FakeAgent", "Stats", "build_fleet", "parse_mix",
           "parse_servers", "run", "snapshot"]

log = logging.getLogger(__name__)
STREAMS_PER_CHANNEL = 100


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


def build_fleet(n: int, mix: list[tuple[str, float]], *, heartbeat_s: float, stats: Stats,
                seed: int = 0, prefix: str = "sim") -> list[FakeAgent]:
    rng = random.Random(seed)
    names, weights = zip(*mix, strict=True)
    tails = {name: heartbeat_tail(KINDS[name]) for name in names}
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
