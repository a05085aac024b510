"""Reading GPUs through NVML, the driver's own library (``pynvml`` from nvidia-ml-py).

NVML is preferred to ``nvidia-smi``: it answers in milliseconds rather than the
second ``nvidia-smi -q`` takes on an eight-GPU node, and it reports the compute
capability, which the XML does not. The module is passed in so that tests use a
fake; every NVML failure leaves here as ``NvmlError``.

NVLink peers come from each link's state and the PCI bus id at its far end. A
link that ends at an NVSwitch (HGX boards, NVL72 trays) reaches every GPU whose
links also end at a switch, so those GPUs are all peers of each other. The
wiring does not change while the driver is loaded, and asking costs up to 36
links x 3 calls per GPU, so it is read once per GPU and kept, not re-read at
every heartbeat.

The processes on each GPU are re-read at every heartbeat, like its memory: they
are what lets a refusal say "GPU 3 used by pid 1234 (python3, 75.0 GiB)" rather
than only how much is used. NVML gives pids, not names; the name comes from
``/proc/PID/comm`` when this agent can see the pid (one that ended since, or
that a container's pid namespace hides, reads "").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Gpu, GpuProcess


class NvmlError(LlmgwError):
    """NVML could not be loaded or did not answer."""


#: NVML_VALUE_NOT_AVAILABLE for a 64-bit value; newer nvidia-ml-py turns it into None itself.
_NOT_AVAILABLE = (1 << 64) - 1


def _memory(value: object) -> int:
    """A process's usedGpuMemory in bytes; None or NOT_AVAILABLE (WDDM, MIG, containers) as 0."""
    if not isinstance(value, int) or value < 0 or value >= _NOT_AVAILABLE:
        return 0
    return value


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def bus_id(value: str | bytes) -> str:
    """``"00000000:07:00.0"`` (NVML, nvidia-smi) as ``"0000:07:00.0"``, the form /sys/bus/pci/devices uses.

    One spelling for every source, so a GPU can be matched with the adapter on
    the same PCIe switch and a link's far end with the GPU it names.
    """
    text = _text(value).strip().lower()
    domain, _, rest = text.rpartition(":")
    head, _, bus = domain.rpartition(":")
    try:
        return f"{int(head or '0', 16):04x}:{int(bus, 16):02x}:{rest}" if rest else text
    except ValueError:
        return text


@dataclasses.dataclass(frozen=True, slots=True)
class _Wiring:
    pci_bus_id: str
    #: Bus ids at the far end of each active link that ends at another GPU.
    remote: frozenset[str]
    on_switch: bool


class Nvml:
    """An initialised NVML, kept open so that repeated reads cost no re-initialisation."""

    def __init__(self, module: Any, *, proc_root: Path = Path("/proc")) -> None:
        self._m = module
        self._proc = proc_root
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise NvmlError(f"NVML is not available ({exc})") from exc
        self._open = True
        self._wiring: dict[int, _Wiring] = {}

    def read(self) -> tuple[Gpu, ...]:
        """Every GPU that answers. One that does not is left out, not reported as empty.

        A GPU that fell off the bus answers ``GPU is lost``; reporting it with
        zero memory used would make it look like the freest card on the node.
        """
        m = self._m
        try:
            count = m.nvmlDeviceGetCount()
        except m.NVMLError as exc:
            raise NvmlError(f"NVML could not count the GPUs ({exc})") from exc
        gpus: list[Gpu] = []
        for index in range(count):
            try:
                handle = m.nvmlDeviceGetHandleByIndex(index)
                memory = m.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(Gpu(
                    index=index,
                    uuid=_text(m.nvmlDeviceGetUUID(handle)),
                    name=_text(m.nvmlDeviceGetName(handle)),
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    compute_capability=self._capability(handle),
                    processes=self._processes(handle),
                    utilization_percent=self._utilization(handle),
                ))
            except m.NVMLError:
                continue
            if index not in self._wiring:
                self._wiring[index] = self._wire(handle)
        return self._with_peers(gpus)

    def _with_peers(self, gpus: list[Gpu]) -> tuple[Gpu, ...]:
        by_bus = {self._wiring[g.index].pci_bus_id: g.index for g in gpus if self._wiring[g.index].pci_bus_id}
        switched = {g.index for g in gpus if self._wiring[g.index].on_switch}
        out: list[Gpu] = []
        for g in gpus:
            w = self._wiring[g.index]
            peers = {by_bus[r] for r in w.remote if r in by_bus} | (switched if w.on_switch else set())
            out.append(dataclasses.replace(g, pci_bus_id=w.pci_bus_id, nvlink_peers=tuple(sorted(peers - {g.index}))))
        return tuple(out)

    def _wire(self, handle: Any) -> _Wiring:
        """This GPU's bus id and where its active NVLinks go. Every failure reads as "no link"."""
        m = self._m
        try:
            own = bus_id(m.nvmlDeviceGetPciInfo(handle).busId)
        except (m.NVMLError, AttributeError):
            own = ""
        remote: set[str] = set()
        on_switch = False
        # Older nvidia-ml-py lacks some of these; a PCIe card answers NOT_SUPPORTED
        # for every link, and a link past the last one INVALID_ARGUMENT.
        state = getattr(m, "nvmlDeviceGetNvLinkState", None)
        far = getattr(m, "nvmlDeviceGetNvLinkRemotePciInfo", None)
        kind = getattr(m, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        switch = getattr(m, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        if state is None or far is None:
            return _Wiring(own, frozenset(), False)
        for link in range(int(getattr(m, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if state(handle, link) != getattr(m, "NVML_FEATURE_ENABLED", 1):
                    continue
                end = bus_id(far(handle, link).busId)
            except m.NVMLError:
                continue
            try:
                is_switch = kind is not None and kind(handle, link) == switch
            except m.NVMLError:
                is_switch = False
            if is_switch:
                on_switch = True
            else:
                remote.add(end)
        return _Wiring(own, frozenset(remote), on_switch)

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes on the GPU, by pid; () when NVML cannot list them.

        A process with both kinds of context is listed by both calls and kept
        once. Never a reason to leave the GPU out: a listing that fails (NOT_SUPPORTED
        on some boards, NO_PERMISSION in some containers) only loses the pids.
        """
        m = self._m
        used: dict[int, int] = {}
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            listing = getattr(m, name, None)
            if listing is None:  # an nvidia-ml-py too old to have it
                continue
            try:
                infos = listing(handle)
            except m.NVMLError:
                continue
            for info in infos:
                pid = int(getattr(info, "pid", 0) or 0)
                if pid <= 0:
                    continue
                used[pid] = max(used.get(pid, 0), _memory(getattr(info, "usedGpuMemory", None)))
        return tuple(GpuProcess(pid, mem, self._comm(pid)) for pid, mem in sorted(used.items()))

    def _comm(self, pid: int) -> str:
        try:
            return (self._proc / str(pid) / "comm").read_text(errors="replace").strip()
        except OSError:  # gone since NVML listed it, or in a pid namespace we cannot see
            return ""

    def driver_version(self) -> str:
        """The kernel driver's version ("570.133.20"); "" when NVML does not say."""
        try:
            return _text(self._m.nvmlSystemGetDriverVersion())
        except (self._m.NVMLError, AttributeError):
            return ""

    def _utilization(self, handle: Any) -> int | None:
        """Percent of the last sample period the GPU was busy; None where the driver cannot say.

        NotSupported (some vGPU profiles, MIG instances) is unknown, not 0 %: a
        chart would otherwise show a busy card as idle.
        """
        try:
            busy = int(self._m.nvmlDeviceGetUtilizationRates(handle).gpu)
        except (self._m.NVMLError, AttributeError, TypeError, ValueError):
            return None
        return busy if 0 <= busy <= 100 else None

    def _capability(self, handle: Any) -> str:
        try:
            major, minor = self._m.nvmlDeviceGetCudaComputeCapability(handle)
        except self._m.NVMLError:
            return ""
        return f"{major}.{minor}"

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._m.nvmlShutdown()
            except self._m.NVMLError:
                pass
