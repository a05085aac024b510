"""What this node has: the inventory an agent registers with, and its load over time.

``discover`` is called at registration; ``LoadSampler`` at every heartbeat.
Both are synchronous and do blocking reads (NVML, ``nvidia-smi``, statvfs), so
an asyncio caller runs them in a thread. Nothing here raises for missing
hardware: a node without GPUs, a driver or ``nvidia-smi`` reports none and says
why once in the log, because a CPU node is a normal node.

Modules: ``host`` (CPUs, memory, disks, OS, facts, management interface),
``gpus`` (choosing between ``nvml`` and ``nvidia_smi``), ``ib`` (InfiniBand and
RoCE adapters from sysfs), ``sm`` (subnet managers), ``fabrics`` (declared
fabrics checked against the adapters), ``nvlink`` (NVLink domain and IMEX),
``files`` (weights, model directories, fingerprints), ``weightmeta`` (what a
GGUF header or config.json says about the model), ``load`` and ``procload``
(the sampler), ``deltas`` (heartbeats that carry only what changed).

The probes that run a tool (``SubnetManagerProbe``, ``NvlinkProbe``) and the
``FabricChecker`` keep state between calls (the last answer, when they last
asked); pass the same instances to ``discover`` and to the heartbeat so that a
reconnect does not ask again what was asked a second ago, and a fabric problem
logged at registration is not logged again until it changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import llmgw.agent.engines
from llmgw.agent.discovery import files, host, ib
from llmgw.agent.discovery import gpus as gpus_mod
from llmgw.agent.discovery.deltas import HeartbeatBuilder, Rescanner
from llmgw.agent.discovery.fabrics import Declared, FabricChecker
from llmgw.agent.discovery.files import fingerprint, scan_weights
from llmgw.agent.discovery.ib import read_hcas
from llmgw.agent.discovery.load import Load, LoadSampler
from llmgw.agent.discovery.nvidia_smi import NvidiaSmiError, parse_nvidia_smi_xml
from llmgw.agent.discovery.nvlink import NvlinkProbe
from llmgw.agent.discovery.sm import SubnetManagerProbe
from llmgw.core.inventory import Inventory, NvlinkFabric

__all__ = ["FabricChecker", "HeartbeatBuilder", "Load", "LoadSampler", "NvidiaSmiError", "NvlinkProbe",
           "Rescanner", "SubnetManagerProbe", "discover", "fingerprint", "parse_nvidia_smi_xml", "read_hcas",
           "scan_weights"]

log = logging.getLogger(__name__)


def _available() -> list[tuple[str, str]]:
    # Looked up at call time, so that the engines module is free to be
    # replaced (or monkeypatched) after this one was imported.
    return llmgw.agent.engines.available()


def discover(*, model_dirs: list[Path], nvml: bool = True, nvidia_smi: str = "nvidia-smi",
             engines: Callable[[], list[tuple[str, str]]] = _available,
             gpu_reader: gpus_mod.GpuReader | None = None,
             os_release: Path = Path("/etc/os-release"), cpuinfo: Path = Path("/proc/cpuinfo"),
             sysfs_root: Path = ib.ROOT, declared_fabrics: Declared = (), mgmt_addr: str = "",
             fabric_checker: FabricChecker | None = None, sm_probe: SubnetManagerProbe | None = None,
             nvlink_probe: NvlinkProbe | None = None, mounts: files.Mounts | None = None) -> Inventory:
    """The node's inventory as it is now. Never raises for absent hardware."""
    reader = gpu_reader or gpus_mod.GpuReader(nvml_enabled=nvml, nvidia_smi_path=nvidia_smi)
    try:
        found_gpus = reader.read()
        facts = host.facts(os_release=os_release, cpuinfo=cpuinfo,
                           driver_version=reader.driver_version if found_gpus else None)
    finally:
        if gpu_reader is None:
            reader.close()
    hcas = read_hcas(root=sysfs_root)
    # Loud: registration is where a dropped fabric is said, with its reason.
    fabrics = (fabric_checker or FabricChecker()).check(declared_fabrics, hcas, loud=True) if declared_fabrics else ()
    nvlink = NvlinkFabric()
    if found_gpus:
        # No GPUs, no NVLink: a CPU node does not run nvidia-smi for nothing.
        probe = nvlink_probe or NvlinkProbe(nvidia_smi=nvidia_smi)
        nvlink = probe.sample() or probe.last or NvlinkFabric()
    total, available = host.memory()
    inv = Inventory(
        cpu_count=host.cpu_count(),
        memory_total_bytes=total,
        memory_available_bytes=available,
        disks=host.disks(model_dirs),
        gpus=found_gpus,
        os=host.os_name(os_release=os_release),
        arch=host.arch(),
        engines=tuple(engines()),
        host=facts,
        hcas=hcas,
        fabrics=fabrics,
        model_dirs=files.model_dirs(model_dirs, mounts=mounts),
        weights=scan_weights(model_dirs),
        nvlink=nvlink,
        subnet_managers=(sm_probe or SubnetManagerProbe()).sample(hcas),
        mgmt_interface=host.mgmt_interface(mgmt_addr) if mgmt_addr else "",
    )
    # One line that says what was found, so a misplaced replica can be traced
    # to what its node said about itself.
    log.info("this node: %d CPUs, %.1f GiB memory, %d GPUs%s, %s %s, driver %s, engines %s",
             inv.cpu_count, inv.memory_total_bytes / (1 << 30), len(inv.gpus),
             f" ({', '.join(sorted({g.name for g in inv.gpus}))})" if inv.gpus else "",
             inv.os, inv.arch, facts.nvidia_driver or "none",
             ", ".join(f"{n} {v}" for n, v in inv.engines) or "none")
    log.info("this node: adapters %s, fabrics %s, NVLink %s, %d weights, management interface %s",
             ", ".join(f"{h.name}{'' if h.usable else ' (down)'}" for h in hcas) or "none",
             ", ".join(f.name for f in fabrics) or "none",
             f"{nvlink.state} {nvlink.cluster_uuid}/{nvlink.clique_id}" if nvlink.state else "none",
             len(inv.weights), inv.mgmt_interface or "not looked for")
    return inv
