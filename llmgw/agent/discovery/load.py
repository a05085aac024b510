"""What the machine is doing now, measured between heartbeats.

Kept apart from ``discover`` because it runs every few seconds: it holds NVML
open between samples instead of initialising it each time, and takes the CPU
figure as the change since the previous sample rather than sleeping to measure.
The InfiniBand adapters are re-read every time (a few small sysfs files per
port), because a port that went down used to be invisible until the agent
restarted, and the node went on being offered multi-node work that hung.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import psutil

from llmgw.agent.discovery import gpus as gpus_mod
from llmgw.agent.discovery import host, ib, procload
from llmgw.core.inventory import Disk, Gpu, Hca, ShardLoad


@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """One sample of the machine's load."""

    memory_total_bytes: int
    memory_available_bytes: int
    #: Percent of all CPUs busy since the previous sample; 0.0 on the first.
    cpu_percent: float
    #: The one-minute load average; 0.0 where the platform has none.
    load1: float
    gpus: tuple[Gpu, ...] = ()
    disks: tuple[Disk, ...] = ()
    load5: float = 0.0
    load15: float = 0.0
    hcas: tuple[Hca, ...] = ()
    #: Shards whose pid was also seen at the previous sample (the first only primes).
    shard_load: tuple[ShardLoad, ...] = ()


class LoadSampler:
    """Samples memory, CPU, load, GPU memory and disk space; ``close`` releases NVML."""

    def __init__(self, *, model_dirs: list[Path], nvml: bool = True, nvidia_smi: str = "nvidia-smi",
                 gpu_reader: gpus_mod.GpuReader | None = None, sysfs_root: Path = ib.ROOT) -> None:
        self._model_dirs = list(model_dirs)
        self._sysfs_root = sysfs_root
        self._shards = procload.ShardLoadSampler()
        self._gpus = gpu_reader or gpus_mod.GpuReader(nvml_enabled=nvml, nvidia_smi_path=nvidia_smi)
        # The first call only primes psutil's counter and returns 0.0. Priming
        # here makes the first real sample measure from construction, rather
        # than reporting an idle machine at the first heartbeat.
        psutil.cpu_percent(interval=None)

    def sample(self, *, shard_pids: Mapping[str, int] | None = None) -> Load:
        """Measures now; ``shard_pids`` ({shard id: pid}) adds each shard's CPU cores and RSS."""
        total, available = host.memory()
        try:
            load1, load5, load15 = os.getloadavg()
        except (AttributeError, OSError):
            load1 = load5 = load15 = 0.0
        return Load(
            memory_total_bytes=total,
            memory_available_bytes=available,
            # interval=None never sleeps: a blocking interval here would stall
            # the heartbeat (and the event loop, if called on it) for a second.
            cpu_percent=float(psutil.cpu_percent(interval=None)),
            load1=float(load1),
            gpus=self._gpus.read(),
            disks=host.disks(self._model_dirs),
            load5=float(load5),
            load15=float(load15),
            hcas=ib.read_hcas(root=self._sysfs_root),
            shard_load=self._shards.sample(shard_pids or {}),
        )

    def close(self) -> None:
        self._gpus.close()
