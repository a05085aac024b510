"""The machine itself: CPUs, memory, the disks under the model directories, OS, arch and driver.

Everything is read fresh on each call. Memory is added to running VMs and disks
fill up, and a figure cached at start-up is the one that is wrong on exactly the
node that matters. ``facts`` is what an engine installer needs to choose a
build (OS and codename for packages, CPU flags for an AVX-512 wheel, the
driver for a CUDA version); ``mgmt_interface`` names the interface NCCL and
Gloo bootstrap over.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import platform
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from llmgw.core.inventory import Disk, HostFacts

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


def nearest_existing(path: Path) -> Path:
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
            usage = psutil.disk_usage(str(nearest_existing(d)))
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


def cpu_flags(text: str) -> tuple[str, ...]:
    """The first ``flags`` (x86) or ``Features`` (Arm) line of /proc/cpuinfo, sorted and unique."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return tuple(sorted(set(value.split())))
    return ()


def _driver_from_proc(path: Path) -> str:
    """``"570.133.20"`` from /proc/driver/nvidia/version's first line; "" without the module."""
    try:
        first = path.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
    except OSError:
        return ""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", first[0]) if first else None
    return m.group(1) if m else ""


def facts(*, os_release: Path = Path("/etc/os-release"), cpuinfo: Path = Path("/proc/cpuinfo"),
          driver_version: Callable[[], str] | None = None,
          nvidia_proc: Path = Path("/proc/driver/nvidia/version")) -> HostFacts:
    """OS id/version/codename, arch, kernel, CPU flags and NVIDIA driver (NVML first, then /proc)."""
    try:
        fields = parse_os_release(os_release.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        fields = {}
    try:
        flags = cpu_flags(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        flags = ()
    driver = ""
    if driver_version is not None:
        try:
            driver = driver_version()
        except Exception as exc:  # any NVML failure means "ask /proc instead"
            log.debug("NVML did not give the driver version: %s", exc)
    return HostFacts(
        os_id=fields.get("ID", ""), os_version=fields.get("VERSION_ID", ""),
        # Debian and Ubuntu name their package suites by codename; Ubuntu derivatives say UBUNTU_CODENAME.
        os_codename=fields.get("VERSION_CODENAME", "") or fields.get("UBUNTU_CODENAME", ""),
        arch=arch(), kernel=platform.release(), cpu_flags=flags,
        nvidia_driver=driver or _driver_from_proc(nvidia_proc),
    )


def mgmt_interface(addr: str, *, if_addrs: Callable[[], Mapping[str, Sequence[Any]]] = psutil.net_if_addrs) -> str:
    """The interface holding ``addr``; ``lo`` for a loopback address; ``eth0`` with a warning when none holds it.

    Found, never defaulted: when eth0 was the default, a node on ens3 or bond0
    had NCCL and Gloo bootstrap over an interface it does not have.
    """
    try:
        wanted = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        wanted = None
    if wanted is not None:
        try:
            interfaces = if_addrs()
        except OSError:
            interfaces = {}
        for name, addresses in sorted(interfaces.items()):
            for a in addresses:
                try:
                    if ipaddress.ip_address(str(a.address).split("%")[0]) == wanted:
                        return name
                except ValueError:
                    continue  # a MAC address (AF_PACKET), not an IP
        if wanted.is_loopback:
            return "lo"
    log.warning("no interface on this node holds the management address %r; NCCL and Gloo will be told eth0, "
                "which may not exist here; set mgmt_interface in the agent configuration", addr)
    return "eth0"
