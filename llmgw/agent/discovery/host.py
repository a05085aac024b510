"""The machine itself: CPUs, memory, the disks under the model directories, OS and arch.

Everything is read fresh on each call. Memory is added to running VMs and disks
fill up, and a figure cached at start-up is the one that is wrong on exactly the
node that matters.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import psutil

from llmgw.core.inventory import Disk

log = logging.getLogger(__name__)


def cpu_count() -> int:
    """CPUs this process may run on, which is what its engines inherit.

    The affinity mask rather than ``os.cpu_count()``: an agent started under
    ``taskset`` or a cpuset on 8 of 64 CPUs would otherwise hand a llama.cpp
    engine 64 threads fighting over 8 cores.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or psutil.cpu_count() or 1


def memory() -> tuple[int, int]:
    """(total, available) bytes of RAM."""
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def _existing(path: Path) -> Path:
    """The path itself, or its nearest ancestor that exists.

    A model directory that has not been created yet (the weights cache before
    the first download) still has a filesystem under it, and that is the one
    the download will fill; creating it here would be discovery writing to disk.
    """
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def disks(model_dirs: list[Path]) -> tuple[Disk, ...]:
    """Size and free space of the filesystem under each model directory, as configured."""
    out: list[Disk] = []
    for d in model_dirs:
        try:
            usage = psutil.disk_usage(str(_existing(d)))
        except OSError as exc:
            # One unreadable mount (a stale NFS handle) must not hide the others.
            log.warning("cannot measure the disk under %s: %s", d, exc)
            continue
        out.append(Disk(path=str(d), total_bytes=int(usage.total), free_bytes=int(usage.free)))
    return tuple(out)


def parse_os_release(text: str) -> dict[str, str]:
    """The KEY=value pairs of an os-release file, quotes removed."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            fields[key] = value.strip().strip("\"'")
    return fields


def os_name(*, os_release: Path = Path("/etc/os-release")) -> str:
    """``"ubuntu 22.04"`` from os-release; the kernel's name and release without one."""
    try:
        fields = parse_os_release(os_release.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        fields = {}
    name = " ".join(v for v in (fields.get("ID", ""), fields.get("VERSION_ID", "")) if v)
    return name or f"{platform.system().lower()} {platform.release()}".strip()


def arch() -> str:
    """``x86_64``, ``aarch64``: what a wheel or an engine binary is built for."""
    return platform.machine()
