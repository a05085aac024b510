"""Conversion between the wire messages and ``llmgw.core`` types.

This is the only place protobuf objects turn into domain objects and back, on
both ends of the stream, so neither the agent nor the control plane passes
generated classes around (and a schema change is handled here once).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import fabrictest as ft
from llmgw.core import inventory as inv
from llmgw.core import kvdigest
from llmgw.core import provision as prov
from llmgw.core.adapters import Adapter
from llmgw.core.shards import FetchProgress, ShardSpec, ShardState, ShardStatus

_STATE_TO_PB = {
    ShardState.STARTING: pb.SHARD_STATE_STARTING,
    ShardState.READY: pb.SHARD_STATE_READY,
    ShardState.FAILED: pb.SHARD_STATE_FAILED,
    ShardState.STOPPING: pb.SHARD_STATE_STOPPING,
    ShardState.STOPPED: pb.SHARD_STATE_STOPPED,
    ShardState.DRAINING: pb.SHARD_STATE_DRAINING,
    ShardState.DRAINED: pb.SHARD_STATE_DRAINED,
    ShardState.UNHEALTHY: pb.SHARD_STATE_UNHEALTHY,
    ShardState.FETCHING: pb.SHARD_STATE_FETCHING,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}


# -- shards ---------------------------------------------------------------------------
def spec_to_pb(spec: ShardSpec) -> pb.ShardSpec:
    return pb.ShardSpec(
        shard_id=spec.shard_id, replica_id=spec.replica_id, model=spec.model, engine=spec.engine,
        served_name=spec.served_name, source=spec.source, args=list(spec.args), port=spec.port,
        api_key=spec.api_key, threads=spec.threads, memory_bytes=spec.memory_bytes,
        startup_timeout_s=spec.startup_timeout_s, env=dict(spec.env), gpus=list(spec.gpus),
        nnodes=spec.nnodes, rank=spec.rank, leader_addr=spec.leader_addr, leader_port=spec.leader_port,
        hcas=list(spec.hcas), tensor_parallel=spec.tensor_parallel, pipeline_parallel=spec.pipeline_parallel,
        dtype=spec.dtype, context_length=spec.context_length, gpu_memory_bytes=spec.gpu_memory_bytes,
        source_sha256=spec.source_sha256, source_file=spec.source_file, hub_endpoint=spec.hub_endpoint,
        hub_token=spec.hub_token, mirror_url=spec.mirror_url, engine_version=spec.engine_version,
        adapters=[pb.LoraAdapter(name=a.name, source=a.source) for a in spec.adapters],
        sleep_mode=spec.sleep_mode, kv_events=spec.kv_events,
    )


def spec_from_pb(msg: pb.ShardSpec) -> ShardSpec:
    return ShardSpec(
        shard_id=msg.shard_id, replica_id=msg.replica_id, model=msg.model, engine=msg.engine,
        served_name=msg.served_name, source=msg.source, args=tuple(msg.args), port=msg.port,
        api_key=msg.api_key, threads=msg.threads, memory_bytes=msg.memory_bytes,
        startup_timeout_s=msg.startup_timeout_s, env=tuple(sorted(msg.env.items())), gpus=tuple(msg.gpus),
        # 0 is what an older control plane sends: it knew only one-node replicas.
        nnodes=max(msg.nnodes, 1), rank=msg.rank, leader_addr=msg.leader_addr, leader_port=msg.leader_port,
        hcas=tuple(msg.hcas),
        # 0 from an older control plane, which passed no parallelism to any engine.
        tensor_parallel=max(msg.tensor_parallel, 1), pipeline_parallel=max(msg.pipeline_parallel, 1),
        dtype=msg.dtype, context_length=msg.context_length, gpu_memory_bytes=msg.gpu_memory_bytes,
        source_sha256=msg.source_sha256, source_file=msg.source_file, hub_endpoint=msg.hub_endpoint,
        hub_token=msg.hub_token, mirror_url=msg.mirror_url, engine_version=msg.engine_version,
        adapters=tuple(Adapter(name=a.name, source=a.source) for a in msg.adapters),
        sleep_mode=msg.sleep_mode, kv_events=msg.kv_events,
    )


def status_to_pb(st: ShardStatus) -> pb.ShardStatus:
    msg = pb.ShardStatus(
        shard_id=st.shard_id, replica_id=st.replica_id, state=_STATE_TO_PB[st.state], message=st.message,
        exited=st.exit_code is not None, exit_code=st.exit_code or 0, last_output=list(st.last_output),
        endpoint=st.endpoint, pid=st.pid, adopted=st.adopted, probe_failures=st.probe_failures,
        adapters=list(st.adapters), adapters_message=st.adapters_message,
        sleep_level=st.sleep_level,
    )
    if st.spec is not None:
        msg.spec.CopyFrom(spec_to_pb(st.spec))
    if st.fetch is not None:
        f = st.fetch
        msg.fetch.CopyFrom(pb.FetchProgress(done_bytes=f.done_bytes, total_bytes=f.total_bytes, rate_bps=f.rate_bps,
                                            eta_s=f.eta_s, state=f.state, message=f.message))
    return msg


def status_from_pb(msg: pb.ShardStatus) -> ShardStatus:
    # An agent newer than this control plane may send a state we do not know;
    # treating it as Starting keeps the shard visible without routing to it.
    state = _STATE_FROM_PB.get(msg.state, ShardState.STARTING)
    return ShardStatus(
        shard_id=msg.shard_id, replica_id=msg.replica_id, state=state, message=msg.message,
        exit_code=msg.exit_code if msg.exited else None, last_output=tuple(msg.last_output),
        endpoint=msg.endpoint, pid=msg.pid, spec=spec_from_pb(msg.spec) if msg.HasField("spec") else None,
        adopted=msg.adopted, probe_failures=msg.probe_failures,
        adapters=tuple(msg.adapters), adapters_message=msg.adapters_message,
        sleep_level=msg.sleep_level,
        fetch=FetchProgress(done_bytes=msg.fetch.done_bytes, total_bytes=msg.fetch.total_bytes,
                            rate_bps=msg.fetch.rate_bps, eta_s=msg.fetch.eta_s, state=msg.fetch.state,
                            message=msg.fetch.message) if msg.HasField("fetch") else None,
    )


# -- hardware -----------------------------------------------------------------------------
def gpus_to_pb(gpus: Iterable[inv.Gpu]) -> list[pb.Gpu]:
    return [pb.Gpu(index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
                   memory_used_bytes=g.memory_used_bytes, compute_capability=g.compute_capability,
                   nvlink_peers=list(g.nvlink_peers), pci_bus_id=g.pci_bus_id,
                   processes=[pb.GpuProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes, name=p.name)
                              for p in g.processes],
                   utilization_percent=g.utilization_percent or 0,
                   utilization_known=g.utilization_percent is not None) for g in gpus]


def gpus_from_pb(gpus: Iterable[pb.Gpu]) -> tuple[inv.Gpu, ...]:
    return tuple(inv.Gpu(index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
                         memory_used_bytes=g.memory_used_bytes, compute_capability=g.compute_capability,
                         nvlink_peers=tuple(g.nvlink_peers), pci_bus_id=g.pci_bus_id,
                         processes=tuple(inv.GpuProcess(p.pid, p.used_memory_bytes, p.name)
                                         for p in g.processes),
                         # An older agent sends neither field: unknown, not an idle 0 %.
                         utilization_percent=min(g.utilization_percent, 100) if g.utilization_known else None)
                 for g in gpus)


def _disks_to_pb(disks: Iterable[inv.Disk]) -> list[pb.Disk]:
    return [pb.Disk(path=d.path, total_bytes=d.total_bytes, free_bytes=d.free_bytes) for d in disks]


def _disks_from_pb(disks: Iterable[pb.Disk]) -> tuple[inv.Disk, ...]:
    return tuple(inv.Disk(d.path, d.total_bytes, d.free_bytes) for d in disks)


def hcas_to_pb(hcas: Iterable[inv.Hca]) -> list[pb.Hca]:
    return [pb.Hca(name=h.name, node_guid=h.node_guid, ports=[
        pb.HcaPort(port=p.port, state=p.state, phys_state=p.phys_state, rate_gbps=p.rate_gbps,
                   link_layer=p.link_layer, port_guid=p.port_guid, gid_prefix=p.gid_prefix,
                   roce_v2_gid_index=p.roce_v2_gid_index, counters=dict(p.counters), netdev=p.netdev)
        for p in h.ports]) for h in hcas]


def hcas_from_pb(hcas: Iterable[pb.Hca]) -> tuple[inv.Hca, ...]:
    return tuple(inv.Hca(h.name, h.node_guid, tuple(
        inv.HcaPort(port=p.port, state=p.state, phys_state=p.phys_state, rate_gbps=p.rate_gbps,
                    link_layer=p.link_layer, port_guid=p.port_guid, gid_prefix=p.gid_prefix,
                    roce_v2_gid_index=p.roce_v2_gid_index, counters=tuple(sorted(p.counters.items())),
                    netdev=p.netdev)
        for p in h.ports)) for h in hcas)


def fabrics_to_pb(fabrics: Iterable[inv.Fabric]) -> list[pb.Fabric]:
    return [pb.Fabric(name=f.name, hcas=list(f.hcas)) for f in fabrics]


def fabrics_from_pb(fabrics: Iterable[pb.Fabric]) -> tuple[inv.Fabric, ...]:
    return tuple(inv.Fabric(f.name, tuple(f.hcas)) for f in fabrics)


def model_dirs_to_pb(dirs: Iterable[inv.ModelDir]) -> list[pb.ModelDir]:
    return [pb.ModelDir(path=d.path, total_bytes=d.total_bytes, free_bytes=d.free_bytes, shared=d.shared,
                        fs_type=d.fs_type) for d in dirs]


def model_dirs_from_pb(dirs: Iterable[pb.ModelDir]) -> tuple[inv.ModelDir, ...]:
    return tuple(inv.ModelDir(d.path, d.total_bytes, d.free_bytes, d.shared, d.fs_type) for d in dirs)


#: The WeightFile fields that are numbers of the same name on both sides.
_WEIGHT_NUMBERS = ("size_bytes", "params", "layers", "heads", "kv_heads", "head_dim", "hidden_size",
                   "context_length", "dtype_bytes")
#: Every WeightFile field but path and format, the same name and type on both sides.
_WEIGHT_FIELDS = (*_WEIGHT_NUMBERS, "fetched_by_llmgw", "source", "last_used_unix", "cache_name")


def weights_to_pb(weights: Iterable[inv.WeightFile]) -> list[pb.WeightFile]:
    return [pb.WeightFile(path=w.path, format=w.format, **{f: getattr(w, f) for f in _WEIGHT_FIELDS})
            for w in weights]


def weights_from_pb(weights: Iterable[pb.WeightFile]) -> tuple[inv.WeightFile, ...]:
    # An older agent sends none of the metadata: every field reads 0, "unknown".
    return tuple(inv.WeightFile(path=w.path, format=w.format, **{f: getattr(w, f) for f in _WEIGHT_FIELDS})
                 for w in weights)


def sms_to_pb(sms: Iterable[inv.SubnetManager]) -> list[pb.SubnetManager]:
    return [pb.SubnetManager(lid=s.lid, guid=s.guid, priority=s.priority, state=s.state, via=s.via) for s in sms]


def sms_from_pb(sms: Iterable[pb.SubnetManager]) -> tuple[inv.SubnetManager, ...]:
    return tuple(inv.SubnetManager(s.lid, s.guid, s.priority, s.state, s.via) for s in sms)


def _nvlink_to_pb(n: inv.NvlinkFabric) -> pb.NvlinkFabric:
    return pb.NvlinkFabric(state=n.state, clique_id=n.clique_id, cluster_uuid=n.cluster_uuid,
                           imex_state=n.imex_state)


def _nvlink_from_pb(n: pb.NvlinkFabric) -> inv.NvlinkFabric:
    return inv.NvlinkFabric(n.state, n.clique_id, n.cluster_uuid, n.imex_state)


def _engines_to_pb(engines: Iterable[tuple[str, str]]) -> list[pb.EngineInfo]:
    return [pb.EngineInfo(name=n, version=v) for n, v in engines]


# -- engine installs (issue 14) ---------------------------------------------------------------
_INSTALL_TO_PB = {prov.InstallState.Installing: pb.INSTALLING, prov.InstallState.Ready: pb.INSTALL_READY,
                  prov.InstallState.Failed: pb.INSTALL_FAILED, prov.InstallState.Unsupported: pb.INSTALL_UNSUPPORTED}
_INSTALL_FROM_PB = {v: k for k, v in _INSTALL_TO_PB.items()}


def installs_to_pb(installs: Iterable[prov.EngineInstall]) -> list[pb.EngineInstall]:
    return [pb.EngineInstall(engine=i.engine, version=i.version, variant=i.variant, state=_INSTALL_TO_PB[i.state],
                             message=i.message, bytes_done=i.bytes_done, bytes_total=i.bytes_total,
                             last_output=list(i.last_output), path=i.path, checked_unix=i.checked_unix,
                             retry_unix=i.retry_unix, missing_os_packages=list(i.missing_os_packages),
                             os_install_command=i.os_install_command) for i in installs]


def installs_from_pb(msgs: Iterable[pb.EngineInstall]) -> tuple[prov.EngineInstall, ...]:
    # An unknown state (from a newer agent) reads as Failed: not runnable, and shown.
    return tuple(prov.EngineInstall(engine=m.engine, version=m.version, variant=m.variant,
                                    state=_INSTALL_FROM_PB.get(m.state, prov.InstallState.Failed),
                                    message=m.message, bytes_done=m.bytes_done, bytes_total=m.bytes_total,
                                    last_output=tuple(m.last_output), path=m.path, checked_unix=m.checked_unix,
                                    retry_unix=m.retry_unix, missing_os_packages=tuple(m.missing_os_packages),
                                    os_install_command=m.os_install_command) for m in msgs)


def provision_to_pb(p: prov.Provision) -> pb.Provision:
    return pb.Provision(wants=[pb.EngineWant(engine=w.engine, version=w.version) for w in p.wants],
                        index_url=p.index_url, find_links=p.find_links,
                        remove=[pb.EngineWant(engine=w.engine, version=w.version) for w in p.remove],
                        os_packages=p.os_packages)


def provision_from_pb(m: pb.Provision) -> prov.Provision:
    return prov.Provision(wants=tuple(prov.EngineWant(w.engine, w.version) for w in m.wants), index_url=m.index_url,
                          find_links=m.find_links, remove=tuple(prov.EngineWant(w.engine, w.version) for w in m.remove),
                          os_packages=m.os_packages)


# -- registration and heartbeats ------------------------------------------------------------
def register_fields(i: inv.Inventory) -> dict[str, object]:
    """The keyword arguments of ``pb.Register`` that carry an inventory."""
    h = i.host
    return {
        "inventory": pb.Inventory(cpu_count=i.cpu_count, memory_total_bytes=i.memory_total_bytes,
                                  memory_available_bytes=i.memory_available_bytes, os=i.os, arch=i.arch,
                                  disks=_disks_to_pb(i.disks), gpus=gpus_to_pb(i.gpus)),
        "engines": _engines_to_pb(i.engines),
        "mgmt_interface": i.mgmt_interface,
        "host": pb.HostFacts(os_id=h.os_id, os_version=h.os_version, os_codename=h.os_codename, arch=h.arch,
                             kernel=h.kernel, cpu_flags=list(h.cpu_flags), nvidia_driver=h.nvidia_driver),
        "hcas": hcas_to_pb(i.hcas), "fabrics": fabrics_to_pb(i.fabrics), "model_dirs": model_dirs_to_pb(i.model_dirs),
        "weights": weights_to_pb(i.weights), "nvlink": _nvlink_to_pb(i.nvlink),
        "subnet_managers": sms_to_pb(i.subnet_managers),
        "installs": installs_to_pb(i.installs),
    }


def inventory_from_register(reg: pb.Register) -> inv.Inventory:
    m, h = reg.inventory, reg.host
    return inv.Inventory(
        cpu_count=m.cpu_count, memory_total_bytes=m.memory_total_bytes,
        memory_available_bytes=m.memory_available_bytes, os=m.os, arch=m.arch, disks=_disks_from_pb(m.disks),
        gpus=gpus_from_pb(m.gpus), engines=tuple((e.name, e.version) for e in reg.engines),
        host=inv.HostFacts(h.os_id, h.os_version, h.os_codename, h.arch, h.kernel, tuple(h.cpu_flags),
                           h.nvidia_driver),
        hcas=hcas_from_pb(reg.hcas), fabrics=fabrics_from_pb(reg.fabrics),
        model_dirs=model_dirs_from_pb(reg.model_dirs), weights=weights_from_pb(reg.weights),
        nvlink=_nvlink_from_pb(reg.nvlink), subnet_managers=sms_from_pb(reg.subnet_managers),
        mgmt_interface=reg.mgmt_interface, installs=installs_from_pb(reg.installs),
    )


def heartbeat_to_pb(hb: inv.Heartbeat) -> pb.Heartbeat:
    msg = pb.Heartbeat(
        memory_total_bytes=hb.memory_total_bytes, memory_available_bytes=hb.memory_available_bytes,
        cpu_percent=hb.cpu_percent, load1=hb.load1, load5=hb.load5, load15=hb.load15, gpus=gpus_to_pb(hb.gpus),
        disks=_disks_to_pb(hb.disks), hcas=hcas_to_pb(hb.hcas),
        shard_load=[pb.ShardLoad(shard_id=s.shard_id, cpu_cores=s.cpu_cores, rss_bytes=s.rss_bytes)
                    for s in hb.shard_load])
    if hb.weights is not None:
        msg.weights_changed = True
        msg.weights.extend(weights_to_pb(hb.weights))
    if hb.fabrics is not None:
        msg.fabrics_changed = True
        msg.fabrics.extend(fabrics_to_pb(hb.fabrics))
    if hb.engines is not None:
        msg.engines_changed = True
        msg.engines.extend(_engines_to_pb(hb.engines))
    if hb.model_dirs is not None:
        msg.model_dirs_changed = True
        msg.model_dirs.extend(model_dirs_to_pb(hb.model_dirs))
    if hb.nvlink is not None:
        msg.nvlink.CopyFrom(_nvlink_to_pb(hb.nvlink))
    if hb.subnet_managers is not None:
        msg.subnet_managers_changed = True
        msg.subnet_managers.extend(sms_to_pb(hb.subnet_managers))
    if hb.installs is not None:
        msg.installs_changed = True
        msg.installs.extend(installs_to_pb(hb.installs))
    return msg


def heartbeat_from_pb(msg: pb.Heartbeat) -> inv.Heartbeat:
    return inv.Heartbeat(
        memory_total_bytes=msg.memory_total_bytes, memory_available_bytes=msg.memory_available_bytes,
        cpu_percent=msg.cpu_percent, load1=msg.load1, load5=msg.load5, load15=msg.load15,
        gpus=gpus_from_pb(msg.gpus), disks=_disks_from_pb(msg.disks), hcas=hcas_from_pb(msg.hcas),
        shard_load=tuple(inv.ShardLoad(s.shard_id, s.cpu_cores, s.rss_bytes) for s in msg.shard_load),
        weights=weights_from_pb(msg.weights) if msg.weights_changed else None,
        fabrics=fabrics_from_pb(msg.fabrics) if msg.fabrics_changed else None,
        engines=tuple((e.name, e.version) for e in msg.engines) if msg.engines_changed else None,
        model_dirs=model_dirs_from_pb(msg.model_dirs) if msg.model_dirs_changed else None,
        nvlink=_nvlink_from_pb(msg.nvlink) if msg.HasField("nvlink") else None,
        subnet_managers=sms_from_pb(msg.subnet_managers) if msg.subnet_managers_changed else None,
        installs=installs_from_pb(msg.installs) if msg.installs_changed else None,
    )


def fabric_test_to_pb(r: ft.FabricTestRequest) -> pb.FabricTestRequest:
    return pb.FabricTestRequest(test_id=r.test_id, role=r.role, hca=r.hca, hca_port=r.hca_port, tcp_port=r.tcp_port,
                                peer_addr=r.peer_addr, size_bytes=r.size_bytes, duration_s=r.duration_s,
                                gid_index=r.gid_index)


def fabric_test_from_pb(m: pb.FabricTestRequest) -> ft.FabricTestRequest:
    return ft.FabricTestRequest(test_id=m.test_id, role=m.role, hca=m.hca, hca_port=m.hca_port,
                                tcp_port=m.tcp_port or ft.DEFAULT_TCP_PORT, peer_addr=m.peer_addr,
                                size_bytes=m.size_bytes or 65536, duration_s=m.duration_s or 5, gid_index=m.gid_index)


def fabric_result_to_pb(r: ft.FabricTestResult) -> pb.FabricTestResult:
    return pb.FabricTestResult(test_id=r.test_id, role=r.role, ok=r.ok, error=r.error, gbps=r.gbps,
                               port_rate_gbps=r.port_rate_gbps, output=list(r.output))


def fabric_result_from_pb(m: pb.FabricTestResult) -> ft.FabricTestResult:
    return ft.FabricTestResult(test_id=m.test_id, role=m.role, ok=m.ok, error=m.error, gbps=m.gbps,
                               port_rate_gbps=m.port_rate_gbps, output=tuple(m.output))


# -- KV digests (routing kv_aware) -------------------------------------------------------
def digest_to_pb(d: kvdigest.Digest) -> pb.KvDigest:
    return pb.KvDigest(replica_id=d.replica_id, epoch=d.epoch, seq=d.seq, block_size=d.hashing.block_size,
                       hash_algo=d.hashing.algo, hash_seed=d.hashing.seed, added=list(d.added),
                       removed=list(d.removed), full=d.full)


def digest_from_pb(msg: pb.KvDigest) -> kvdigest.Digest:
    return kvdigest.Digest(msg.replica_id, msg.epoch, msg.seq,
                           kvdigest.Hashing(max(1, msg.block_size), msg.hash_algo or "sha256", msg.hash_seed),
                           tuple(msg.added), tuple(msg.removed), msg.full)
