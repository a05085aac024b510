"""Reading GPUs through NVML, the driver's own library (``pynvml`` from nvidia-ml-py).

NVML is preferred to ``nvidia-smi``: it answers in milliseconds rather than the
second ``nvidia-smi -q`` takes on an eight-GPU node, and it reports the compute
capability, which the XML does not. The module is passed in so that tests use a
fake; every NVML failure leaves here as ``NvmlError``.
"""

from __future__ import annotations

from typing import Any

from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Gpu


class NvmlError(LlmgwError):
    """NVML could not be loaded or did not answer."""


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Nvml:
    """An initialised NVML, kept open so that repeated reads cost no re-initialisation."""

    def __init__(self, module: Any) -> None:
        self._m = module
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise NvmlError(f"NVML is not available ({exc})") from exc
        self._open = True

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
                ))
            except m.NVMLError:
                continue
        return tuple(gpus)

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
