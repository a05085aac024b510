"""Conversion between the wire messages and ``llmgw.core`` types.

This is the only place protobuf objects turn into domain objects and back, on
both ends of the stream, so neither the agent nor the control plane passes
generated classes around (and a schema change is handled here once).
"""

from __future__ import annotations

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core.inventory import Disk, Gpu, Inventory
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

_STATE_TO_PB = {
    ShardState.STARTING: pb.SHARD_STATE_STARTING,
    ShardState.READY: pb.SHARD_STATE_READY,
    ShardState.FAILED: pb.SHARD_STATE_FAILED,
    ShardState.STOPPING: pb.SHARD_STATE_STOPPING,
    ShardState.STOPPED: pb.SHARD_STATE_STOPPED,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}


def spec_to_pb(spec: ShardSpec) -> pb.ShardSpec:
    return pb.ShardSpec(
        shard_id=spec.shard_id, replica_id=spec.replica_id, model=spec.model, engine=spec.engine,
        served_name=spec.served_name, source=spec.source, args=list(spec.args), port=spec.port,
        api_key=spec.api_key, threads=spec.threads, memory_bytes=spec.memory_bytes,
        startup_timeout_s=spec.startup_timeout_s, env=dict(spec.env),
    )


def spec_from_pb(msg: pb.ShardSpec) -> ShardSpec:
    return ShardSpec(
        shard_id=msg.shard_id, replica_id=msg.replica_id, model=msg.model, engine=msg.engine,
        served_name=msg.served_name, source=msg.source, args=tuple(msg.args), port=msg.port,
        api_key=msg.api_key, threads=msg.threads, memory_bytes=msg.memory_bytes,
        startup_timeout_s=msg.startup_timeout_s, env=tuple(sorted(msg.env.items())),
    )


def status_to_pb(st: ShardStatus) -> pb.ShardStatus:
    msg = pb.ShardStatus(
        shard_id=st.shard_id, replica_id=st.replica_id, state=_STATE_TO_PB[st.state], message=st.message,
        exited=st.exit_code is not None, exit_code=st.exit_code or 0, last_output=list(st.last_output),
        endpoint=st.endpoint, pid=st.pid,
    )
    if st.spec is not None:
        msg.spec.CopyFrom(spec_to_pb(st.spec))
    return msg


def status_from_pb(msg: pb.ShardStatus) -> ShardStatus:
    # An agent newer than this control plane may send a state we do not know;
    # treating it as Starting keeps the shard visible without routing to it.
    state = _STATE_FROM_PB.get(msg.state, ShardState.STARTING)
    return ShardStatus(
        shard_id=msg.shard_id, replica_id=msg.replica_id, state=state, message=msg.message,
        exit_code=msg.exit_code if msg.exited else None, last_output=tuple(msg.last_output),
        endpoint=msg.endpoint, pid=msg.pid, spec=spec_from_pb(msg.spec) if msg.HasField("spec") else None,
    )


def _gpu_to_pb(g: Gpu) -> pb.Gpu:
    return pb.Gpu(index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
                  memory_used_bytes=g.memory_used_bytes, compute_capability=g.compute_capability)


def _gpu_from_pb(g: pb.Gpu) -> Gpu:
    return Gpu(index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
               memory_used_bytes=g.memory_used_bytes, compute_capability=g.compute_capability)


def inventory_to_pb(inv: Inventory) -> tuple[pb.Inventory, list[pb.EngineInfo]]:
    msg = pb.Inventory(
        cpu_count=inv.cpu_count, memory_total_bytes=inv.memory_total_bytes,
        memory_available_bytes=inv.memory_available_bytes, os=inv.os, arch=inv.arch,
        disks=[pb.Disk(path=d.path, total_bytes=d.total_bytes, free_bytes=d.free_bytes) for d in inv.disks],
        gpus=[_gpu_to_pb(g) for g in inv.gpus],
    )
    return msg, [pb.EngineInfo(name=n, version=v) for n, v in inv.engines]


def inventory_from_pb(msg: pb.Inventory, engines: list[pb.EngineInfo]) -> Inventory:
    return Inventory(
        cpu_count=msg.cpu_count, memory_total_bytes=msg.memory_total_bytes,
        memory_available_bytes=msg.memory_available_bytes, os=msg.os, arch=msg.arch,
        disks=tuple(Disk(d.path, d.total_bytes, d.free_bytes) for d in msg.disks),
        gpus=tuple(_gpu_from_pb(g) for g in msg.gpus),
        engines=tuple((e.name, e.version) for e in engines),
    )


def gpus_from_pb(gpus: list[pb.Gpu]) -> tuple[Gpu, ...]:
    return tuple(_gpu_from_pb(g) for g in gpus)


def gpus_to_pb(gpus: tuple[Gpu, ...]) -> list[pb.Gpu]:
    return [_gpu_to_pb(g) for g in gpus]
