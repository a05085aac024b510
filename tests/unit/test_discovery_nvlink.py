"""The NVLink domain from nvidia-smi -q, its pacing, IMEX, and NVLink peers through a fake NVML."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmgw.agent.discovery import gpus, nvlink, nvml
from llmgw.core.inventory import NvlinkFabric

FIXTURES = Path(__file__).parent.parent / "fixtures"
GB200 = (FIXTURES / "nvidia-smi-q-gb200.txt").read_text()
IMEX = (FIXTURES / "nvidia-imex-ctl-q.txt").read_text()
CLUSTER = "6a130f54-faaa-4b8f-847f-be44ab70f917"


def test_fabric_section_of_each_gpu() -> None:
    """Four GB200s, each Completed/Success in clique 32766 of one cluster, indexed in printed order."""
    found = nvlink.parse_fabric(GB200)
    assert [(g.index, g.pci_bus_id) for g in found] == [
        (0, "00000008:01:00.0"), (1, "00000009:01:00.0"), (2, "00000018:01:00.0"), (3, "00000019:01:00.0")]
    assert {(g.state, g.status, g.clique_id, g.cluster_uuid, g.health) for g in found} == {
        ("Completed", "Success", "32766", CLUSTER, "Healthy")}
    assert nvlink.summarise(found, imex_state="READY") == NvlinkFabric("Completed", "32766", CLUSTER, "READY")


def test_not_a_domain_member_and_a_failed_join() -> None:
    """N/A (PCIe) is no fabric; a zeroed UUID (HGX H100) is no domain; a bad Status names itself."""
    pcie = GB200.replace("Completed", "N/A").replace("Success", "N/A")
    assert nvlink.summarise(nvlink.parse_fabric(pcie)) == NvlinkFabric()
    h100 = GB200.replace(CLUSTER, "00000000-0000-0000-0000-000000000000").replace("32766", "0")
    assert nvlink.summarise(nvlink.parse_fabric(h100)) == NvlinkFabric(state="Completed")
    one_bad = GB200.replace("Success", "Insufficient Resources", 1)
    assert nvlink.summarise(nvlink.parse_fabric(one_bad)).state == "Completed (Insufficient Resources)"
    joining = GB200.replace("Completed", "In Progress", 1)
    assert nvlink.summarise(nvlink.parse_fabric(joining)).state == "In Progress"


class FakeSmi:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=IMEX if "imex" in argv[0] else GB200, stderr="")


def test_probe_samples_at_most_once_a_minute() -> None:
    """A value on the call that read; None on every call within the minute after it; then again."""
    smi, now = FakeSmi(), [100.0]
    probe = nvlink.NvlinkProbe(run=smi.run, clock=lambda: now[0], which=lambda n: f"/usr/bin/{n}")
    first = probe.sample()
    assert first == NvlinkFabric("Completed", "32766", CLUSTER, "READY") and probe.last == first
    assert smi.calls == [["/usr/bin/nvidia-smi", "-q"], ["/usr/bin/nvidia-imex-ctl", "-q"]]
    now[0] = 159.0
    assert probe.sample() is None and len(smi.calls) == 2
    now[0] = 160.0
    assert probe.sample() == first and len(smi.calls) == 4


def test_missing_nvidia_smi_is_none_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Without the binary every due sample is None, and the reason is logged once; no IMEX is ""."""
    smi, now = FakeSmi(), [0.0]
    probe = nvlink.NvlinkProbe(run=smi.run, clock=lambda: now[0], which=lambda n: None)
    with caplog.at_level(logging.INFO, logger="llmgw.agent.discovery.nvlink"):
        for t in (0.0, 61.0, 122.0):
            now[0] = t
            assert probe.sample() is None
    assert smi.calls == [] and len(caplog.records) == 1
    no_imex = nvlink.NvlinkProbe(run=smi.run, which=lambda n: None if "imex" in n else n)
    assert no_imex.sample() == NvlinkFabric("Completed", "32766", CLUSTER, "")


class FakeNvmlError(Exception):
    pass


def nvml_module(buses: list[str], links: dict[int, list[tuple[str, int]]]) -> SimpleNamespace:
    """A pynvml stand-in: GPUs at ``buses``; ``links[i]`` is (remote bus, device type) per active link."""
    def link(handle: int, n: int) -> tuple[str, int]:
        if n >= len(links.get(handle, [])):
            raise FakeNvmlError("Not Supported")
        return links[handle][n]

    mem = SimpleNamespace(total=80 << 30, used=1 << 20)
    return SimpleNamespace(
        NVMLError=FakeNvmlError, NVML_NVLINK_MAX_LINKS=18, NVML_FEATURE_ENABLED=1, NVML_NVLINK_DEVICE_TYPE_SWITCH=2,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(buses),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetName=lambda h: "NVIDIA H100", nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0), nvmlSystemGetDriverVersion=lambda: b"570.133.20",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=buses[h].encode()),
        nvmlDeviceGetNvLinkState=lambda h, n: link(h, n) and 1,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, n: SimpleNamespace(busId=link(h, n)[0]),
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, n: link(h, n)[1],
    )


def test_nvlink_peers_direct_and_through_a_switch() -> None:
    """Bridged pairs peer with each other; switch-attached GPUs all peer; bus ids take sysfs's spelling."""
    buses = ["00000000:07:00.0", "00000000:0B:00.0", "00000000:48:00.0", "00000000:4C:00.0"]
    bridged = nvml_module(buses, {0: [("00000000:0B:00.0", 0)] * 4, 1: [("00000000:07:00.0", 0)] * 4})
    found = gpus.GpuReader(nvml_module=bridged, which=lambda n: None).read()
    assert [(g.pci_bus_id, g.nvlink_peers) for g in found] == [
        ("0000:07:00.0", (1,)), ("0000:0b:00.0", (0,)), ("0000:48:00.0", ()), ("0000:4c:00.0", ())]
    switched = nvml_module(buses, {i: [("00000000:C1:00.0", 2)] * 18 for i in range(4)})
    reader = gpus.GpuReader(nvml_module=switched, which=lambda n: None)
    assert [g.nvlink_peers for g in reader.read()] == [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]
    assert reader.driver_version() == "570.133.20"


def test_bus_id_spellings() -> None:
    """NVML's eight-digit domain and sysfs's four-digit one name the same device."""
    assert nvml.bus_id("00000000:0B:00.0") == nvml.bus_id(b"0000:0b:00.0") == "0000:0b:00.0"
    assert nvml.bus_id("00000008:01:00.0") == "0008:01:00.0"


def test_gpus_in_different_domains_are_said_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    """The first GPU's domain is reported, and the disagreement is a WARNING only when the answer changes."""
    split = GB200.replace(CLUSTER, "11111111-2222-3333-4444-555555555555", 1)
    now = [0.0]
    probe = nvlink.NvlinkProbe(run=lambda argv, **kw: subprocess.CompletedProcess(argv, 0, stdout=split),
                               clock=lambda: now[0], which=lambda n: None if "imex" in n else n)
    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery.nvlink"):
        for t in (0.0, 60.0, 120.0):
            now[0] = t
            found = probe.sample()
            assert found is not None and found.cluster_uuid.startswith("11111111")
    (said,) = caplog.records
    assert "different NVLink domains" in said.getMessage() and CLUSTER in said.getMessage()
