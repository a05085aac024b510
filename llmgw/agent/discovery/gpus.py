"""Which GPUs this node has: NVML first, ``nvidia-smi -q -x`` when NVML fails, else none.

The source is chosen on the first read and kept: a node's driver does not
appear between two heartbeats, and retrying NVML every five seconds on a
CPU-only node would log the same failure forever. A node without NVIDIA GPUs
is normal, so the reason there are none is logged once, at info level, and is
never an exception: discovery must not stop a CPU node from registering.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmgw.agent.discovery import nvidia_smi, nvml
from llmgw.core.inventory import Gpu

log = logging.getLogger(__name__)
_said: set[str] = set()


def _once(level: int, message: str) -> None:
    # Discovery runs at every registration and the sampler at every heartbeat;
    # "no GPUs here" said each time buries everything else in the journal.
    if message not in _said:
        _said.add(message)
        log.log(level, message)


class GpuReader:
    """Reads the node's GPUs from whichever source works; ``close`` releases NVML."""

    def __init__(self, *, nvml_enabled: bool = True, nvidia_smi_path: str = "nvidia-smi",
                 nvml_module: Any = None, which: Callable[[str], str | None] = shutil.which,
                 run: nvidia_smi.Runner = subprocess.run, timeout_s: float = 10.0,
                 proc_root: Path = Path("/proc")) -> None:
        self._nvml_enabled = nvml_enabled
        self._smi_path = nvidia_smi_path
        self._nvml_module = nvml_module
        self._which = which
        self._run = run
        self._timeout_s = timeout_s
        #: Where NVML's pids are looked up for their names (a fixture in tests).
        self._proc_root = proc_root
        self._chosen = False
        self._nvml: nvml.Nvml | None = None
        self._smi: str | None = None

    def _choose(self) -> None:
        self._chosen = True
        why = "NVML is disabled in the configuration"
        if self._nvml_enabled:
            try:
                module = self._nvml_module
                if module is None:
                    # Imported here: a node with NVML switched off never loads it.
                    import pynvml as module
                self._nvml = nvml.Nvml(module, proc_root=self._proc_root)
                return
            except (nvml.NvmlError, ImportError) as exc:
                why = str(exc)
        self._smi = self._which(self._smi_path)
        if self._smi is None:
            _once(logging.INFO, f"no NVIDIA GPUs will be reported: {why}, and {self._smi_path} "
                                "is not installed")
        else:
            _once(logging.INFO, f"reading GPUs with {self._smi} -q -x: {why}")

    def read(self) -> tuple[Gpu, ...]:
        """The GPUs as they are now; an empty tuple when none can be read."""
        if not self._chosen:
            self._choose()
        try:
            if self._nvml is not None:
                return self._nvml.read()
            if self._smi is not None:
                return nvidia_smi.read_nvidia_smi(self._smi, timeout_s=self._timeout_s, run=self._run)
        except (nvml.NvmlError, nvidia_smi.NvidiaSmiError) as exc:
            _once(logging.WARNING, f"reading GPUs failed: {exc}")
        return ()

    def driver_version(self) -> str:
        """The NVIDIA driver's version through NVML; "" where NVML is not in use."""
        if not self._chosen:
            self._choose()
        return self._nvml.driver_version() if self._nvml is not None else ""

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        self._chosen = False
