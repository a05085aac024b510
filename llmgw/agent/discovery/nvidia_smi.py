"""Reading GPUs from ``nvidia-smi -q -x``: the fallback when NVML cannot be loaded.

NVML is preferred (see ``nvml``); this path exists for the node whose Python
cannot load ``libnvidia-ml.so`` but whose driver tools still work, for example a
container with the binary mounted and the library at an unusual path.

The parser is pure so that it is tested against a fixture of real output; the
one function that runs the binary takes its path and its ``run`` as arguments.
``nvidia-smi -q`` does not report the compute capability, so GPUs found this way
have an empty one; placement that needs it must treat "" as unknown.

Each GPU's ``<processes>`` are read too, as NVML's are: nvidia-smi gives the
executable's path ("/usr/lib/xorg/Xorg"), kept as its last part so that both
sources name a process alike ("Xorg", as /proc/PID/comm has it).
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable

from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Gpu, GpuProcess

_UNITS = {"B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30,
          # Old drivers wrote "MB" and meant MiB; nvidia-smi never counted in powers of ten.
          "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class NvidiaSmiError(LlmgwError):
    """nvidia-smi could not be run, or printed something that is not its XML."""


def _bytes(text: str | None) -> int:
    """``"81559 MiB"`` as bytes; ``"N/A"`` and anything unreadable as 0."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[1].upper() not in _UNITS:
        return 0
    try:
        return int(float(parts[0]) * _UNITS[parts[1].upper()])
    except ValueError:
        return 0


def _percent(text: str | None) -> int | None:
    """``"37 %"`` as 37; ``"N/A"`` (vGPU, MIG) and anything unreadable as None, unknown rather than idle."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[1] != "%":
        return None
    try:
        value = int(float(parts[0]))
    except ValueError:
        return None
    return value if 0 <= value <= 100 else None


def _processes(el: ET.Element) -> tuple[GpuProcess, ...]:
    """The ``<process_info>`` entries of one ``<gpu>``, by pid; one without a readable pid is left out."""
    used: dict[int, GpuProcess] = {}
    for info in el.findall("processes/process_info"):
        try:
            pid = int((info.findtext("pid") or "").strip())
        except ValueError:
            continue
        if pid <= 0:
            continue
        name = (info.findtext("process_name") or "").strip().rpartition("/")[2]
        # "N/A" under MIG and in some containers: reads as 0, like NVML's NOT_AVAILABLE.
        mem = _bytes(info.findtext("used_memory"))
        if pid not in used or mem > used[pid].used_memory_bytes:
            used[pid] = GpuProcess(pid, mem, name)
    return tuple(used[pid] for pid in sorted(used))


def parse_nvidia_smi_xml(text: str) -> tuple[Gpu, ...]:
    """The GPUs in one ``nvidia-smi -q -x`` document, in nvidia-smi's index order."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NvidiaSmiError(f"nvidia-smi printed something that is not XML ({exc})") from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiError(f"nvidia-smi printed <{root.tag}>, not <nvidia_smi_log>")
    gpus: list[Gpu] = []
    # The index is the position, not <minor_number>: the minor number is the
    # /dev/nvidiaN node, which differs from the index NVML and CUDA use (PCI bus
    # order) on some boards, and CUDA_VISIBLE_DEVICES built from it would pick
    # the wrong card.
    for index, el in enumerate(root.findall("gpu")):
        # Only <fb_memory_usage>: <bar1_memory_usage> repeats <total> and <used>
        # and would report a 256 MiB aperture as the card's memory.
        fb = el.find("fb_memory_usage")
        gpus.append(Gpu(
            index=index,
            uuid=(el.findtext("uuid") or "").strip(),
            name=(el.findtext("product_name") or "").strip(),
            memory_total_bytes=_bytes(fb.findtext("total") if fb is not None else None),
            memory_used_bytes=_bytes(fb.findtext("used") if fb is not None else None),
            processes=_processes(el),
            utilization_percent=_percent(el.findtext("utilization/gpu_util")),
        ))
    return tuple(gpus)


def read_nvidia_smi(path: str, *, timeout_s: float = 10.0, run: Runner = subprocess.run) -> tuple[Gpu, ...]:
    """Run ``path -q -x`` (an argv, never a shell) and parse what it prints."""
    try:
        done = run([path, "-q", "-x"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        # A wedged driver makes nvidia-smi hang for minutes; without the timeout
        # the agent would never register.
        raise NvidiaSmiError(f"{path} -q -x did not answer in {timeout_s:g} s") from exc
    except OSError as exc:
        raise NvidiaSmiError(f"could not run {path}: {exc}") from exc
    if done.returncode != 0:
        said = (done.stdout or done.stderr or "").strip().splitlines()
        raise NvidiaSmiError(f"{path} -q -x exited with code {done.returncode}: "
                             f"{said[-1] if said else 'no output'}")
    return parse_nvidia_smi_xml(done.stdout)
