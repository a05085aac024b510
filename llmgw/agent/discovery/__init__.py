"""What this node has: the inventory an agent registers with, and its load over time.

``discover`` is called at registration; ``LoadSampler`` at every heartbeat.
Both are synchronous and do blocking reads (NVML, ``nvidia-smi``, statvfs), so
an asyncio caller runs them in a thread. Nothing here raises for missing
hardware: a node without GPUs, a driver or ``nvidia-smi`` reports none and says
why once in the log, because a CPU node is a normal node.

Modules: ``host`` (CPUs, memory, disks, OS), ``gpus`` (choosing between
``nvml`` and ``nvidia_smi``), ``load`` (the sampler).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import llmgw.agent.engines
from llmgw.agent.discovery import gpus as gpus_mod
from llmgw.agent.discovery import host
from llmgw.agent.discovery.load import Load, LoadSampler
from llmgw.agent.discovery.nvidia_smi import NvidiaSmiError, parse_nvidia_smi_xml
from llmgw.core.inventory import Inventory

__all__ = ["Load", "LoadSampler", "NvidiaSmiError", "discover", "parse_nvidia_smi_xml"]

log = logging.getLogger(__name__)


def _available() -> list[tuple[str, str]]:
    # Looked up at call time, so that the engines module is free to be
    # replaced (or monkeypatched) after this one was imported.
    return llmgw.agent.engines.available()


def discover(*, model_dirs: list[Path], nvml: bool = True, nvidia_smi: str = "nvidia-smi",
             engines: Callable[[], list[tuple[str, str]]] = _available,
             gpu_reader: gpus_mod.GpuReader | None = None,
             os_release: Path = Path("/etc/os-release")) -> Inventory:
    """The node's inventory as it is now. Never raises for absent hardware."""
    reader = gpu_reader or gpus_mod.GpuReader(nvml_enabled=nvml, nvidia_smi_path=nvidia_smi)
    try:
        found_gpus = reader.read()
    finally:
        if gpu_reader is None:
            reader.close()
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
    )
    # One line that says what was found, so a misplaced replica can be traced
    # to what its node said about itself.
    log.info("this node: %d CPUs, %.1f GiB memory, %d GPUs%s, %s %s, engines %s",
             inv.cpu_count, inv.memory_total_bytes / (1 << 30), len(inv.gpus),
             f" ({', '.join(sorted({g.name for g in inv.gpus}))})" if inv.gpus else "",
             inv.os, inv.arch, ", ".join(f"{n} {v}" for n, v in inv.engines) or "none")
    return inv
