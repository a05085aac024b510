"""What the machine is doing now, measured between heartbeats.

Kept apart from ``discover`` because it runs every few seconds: it holds NVML
open between samples instead of initialising it each time, and takes the CPU
figure as the change since the previous sample rather than sleeping to measure.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import psutil

from llmgw.agent.discovery import gpus as gpus_mod
from llmgw.agent.discovery import host
from llmgw.core.inventory import Disk, Gpu


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


class LoadSampler:
    """Samples memory, CPU, load, GPU memory and disk space; ``close`` releases NVML."""

    def __init__(self, *, model_dirs: list[Path], nvml: bool = True, nvidia_smi: str = "nvidia-smi",
                 gpu_reader: gpus_mod.GpuReader | None = None) -> None:
        self._model_dirs = list(model_dirs)
        self._gpus = gpu_reader or gpus_mod.GpuReader(nvml_enabled=nvml, nvidia_smi_path=nvidia_smi)
        # The first call only primes psutil's counter and returns 0.0. Priming
        # here makes the first real sample measure from construction, rather
        # than reporting an idle machine at the first heartbeat.
        psutil.cpu_percent(interval=None)

    def sample(self) -> Load:
        total, available = host.memory()
        try:
            load1 = os.getloadavg()[0]
        except (AttributeError, OSError):
            load1 = 0.0
        return Load(
            memory_total_bytes=total,
            memory_available_bytes=available,
            # interval=None never sleeps: a blocking interval here would stall
            # the heartbeat (and the event loop, if called on it) for a second.
            cpu_percent=float(psutil.cpu_percent(interval=None)),
            load1=float(load1),
            gpus=self._gpus.read(),
            disks=host.disks(self._model_dirs),
        )

    def close(self) -> None:
        self._gpus.close()
